//! The output gates of the two mixers on host memory, bit for bit MLX's
//! ops (docs/cpu.md, "Host ops"): a gated-delta layer's gated RMS norm and
//! gated attention's sigmoid gate. Each returns None when the types are
//! not ones the host ops take (MLX's ops run then).

use super::ops::{norm_rows, norm_type, rounded, store, zip_with_sigmoid};
use super::*;

/// A gated-delta layer's output: the recurrence's `y` (f32, `[B, T, Hv,
/// Dv]`) cast to the activations' type `act`, RMS-normed per head by `w`,
/// times `silu(z)` in f32 (`z`: `[B, T, Hv * Dv]`), cast back to `act`:
/// `[B, T, Hv * Dv]`.
pub fn gated_norm(
    y: &Array,
    z: &Array,
    w: &HostVector,
    eps: f32,
    act: Dtype,
) -> Result<Option<Array>> {
    let (Some(round), Some(normed)) = (rounded(act), norm_type(act, w.dtype)) else {
        return Ok(None);
    };
    if rounded(z.dtype()).is_none() || z.size() != y.size() {
        return Ok(None);
    }
    let mut values = host_f32(y)?;
    for v in values.iter_mut() {
        *v = store(*v, round);
    }
    norm_rows(&mut values, w, eps, normed == Dtype::Bfloat16);
    // silu(z) in f32 is z * sigmoid(z), unrounded.
    zip_with_sigmoid(&mut values, &host_f32(z)?, false, |v, z, s| {
        store(z * s * v, round)
    });
    let shape = y.shape();
    let (b, t) = (shape[0], shape[1]);
    Ok(Some(from_f32(
        &values,
        &[b, t, y.size() as i32 / (b * t)],
        act,
    )?))
}

/// Gated attention's output: `out` `[1, H, L, d]` moved to `[1, L, H * d]`
/// times `sigmoid(gate)`, where the gate of head h is the second half of
/// its `2d` columns of `q_gate` `[1, L, H * 2d]`; both of one type.
pub fn attention_gate(out: &Array, q_gate: &Array) -> Result<Option<Array>> {
    let Some(round) = rounded(out.dtype()).filter(|_| q_gate.dtype() == out.dtype()) else {
        return Ok(None);
    };
    let s = out.shape();
    let (heads, len, d) = (s[1] as usize, s[2] as usize, s[3] as usize);
    if s[0] != 1 || q_gate.size() != 2 * out.size() {
        return Ok(None);
    }
    let (o, qg) = (host_f32(out)?, host_f32(q_gate)?);
    // Both moved to [L, H, d]: each output next to its gate.
    let mut gated = vec![0f32; o.len()];
    let mut gates = vec![0f32; o.len()];
    for l in 0..len {
        for h in 0..heads {
            let at = (l * heads + h) * d;
            gated[at..at + d].copy_from_slice(&o[(h * len + l) * d..][..d]);
            gates[at..at + d].copy_from_slice(&qg[(l * heads + h) * 2 * d + d..][..d]);
        }
    }
    zip_with_sigmoid(&mut gated, &gates, round, |v, _, s| store(v * s, round));
    Ok(Some(from_f32(
        &gated,
        &[1, len as i32, (heads * d) as i32],
        out.dtype(),
    )?))
}
