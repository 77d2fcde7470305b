//! The gated delta recurrence over a long prompt, chunk by chunk, on the
//! CPU (docs/cpu.md, "Chunked prefill"). Per value head, with the state S
//! `[Dv, Dk]` before a chunk of C steps, step i of the chunk adds
//!
//!   u_i = beta_i (v_i - (g_i S_(i-1)) k_i)
//!
//! as the rank-one update u_i k_i^T after the decay g_i. Writing r(i, j) for
//! the decay from step j to step i (g_(j+1) ... g_i, 1 when i = j) and
//! gamma_i for the decay from the chunk's start (g_0 ... g_i):
//!
//!   u_i + sum_(j<i) beta_i r(i, j) (k_i . k_j) u_j = beta_i (v_i - gamma_i S k_i)
//!   y_i = gamma_i S q_i + sum_(j<=i) r(i, j) (q_i . k_j) u_j
//!   S' = gamma_(C-1) S + sum_j r(C-1, j) u_j k_j^T
//!
//! so the state is read and written once a chunk, not once a step, and the
//! work within a chunk is dots between its own keys, queries and deltas
//! (the WY form of the Gated DeltaNet paper; `training/gdn_chunked.py` does
//! the same in MLX ops). The decays are products, never exp of log
//! differences: a g that underflows to 0 stays a 0, not a NaN.
//!
//! Prefill only: it sums in another order than the step path
//! ([`super::gated_delta_host`]), which decode and verify share, so its
//! output is within rounding of that path (tested to 1e-4), not equal to it.
//! Plain decoding and DFlash share the prefill, so DFlash stays lossless.

use super::gated_delta_host::{from_columns, to_columns, Dims, Inputs};
use crate::nn::host::pool;

/// Steps a chunk.
pub const CHUNK: usize = 32;

/// Runs every step of `inputs` from `state` `[Hv, Dv, Dk]`, advanced in
/// place, chunk by chunk. Returns y `[T, Hv, Dv]`.
pub fn run(inputs: Inputs, state: &mut [f32], d: Dims) -> Vec<f32> {
    let per_head = d.steps * d.dv;
    let mut y = vec![0f32; d.hv * per_head];
    let heads: Vec<_> = state
        .chunks_exact_mut(d.dv * d.dk)
        .zip(y.chunks_exact_mut(per_head))
        .enumerate()
        .collect();
    pool::each(heads, |(h, (s, y))| head(h, d, inputs, s, y));
    let mut out = vec![0f32; y.len()];
    for h in 0..d.hv {
        for t in 0..d.steps {
            out[(t * d.hv + h) * d.dv..][..d.dv]
                .copy_from_slice(&y[h * per_head + t * d.dv..][..d.dv]);
        }
    }
    out
}

/// A dot product in 8 lanes (vectorises; the chunked path has its own
/// order of sums anyway).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `acc += scale * x`.
fn axpy(acc: &mut [f32], scale: f32, x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += scale * v;
    }
}

/// `out = S x` for the state by columns (`cols` `[Dk, Dv]`): one axpy a key
/// dimension, over the value rows.
fn state_times(cols: &[f32], x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for (col, &xj) in cols.chunks_exact(out.len()).zip(x) {
        axpy(out, xj, col);
    }
}

/// One value head: `state` `[Dv, Dk]`, `y` its rows `[T, Dv]`. The state is
/// worked on by columns (`[Dk, Dv]`), so every pass over it runs along the
/// value rows and vectorises.
fn head(h: usize, d: Dims, inputs: Inputs, state: &mut [f32], y: &mut [f32]) {
    let Inputs { q, k, v, g, beta } = inputs;
    let kh = h / (d.hv / d.hk);
    let (dk, dv) = (d.dk, d.dv);
    let key = |t: usize| &k[(t * d.hk + kh) * dk..][..dk];
    let query = |t: usize| &q[(t * d.hk + kh) * dk..][..dk];
    let mut cols = to_columns(state, dk, dv);
    // Per chunk: u `[C, Dv]`, the decays r `[C, C]` (row i, columns j <= i),
    // gamma `[C]` and the keys' dots `[C, C]`.
    let mut u = vec![0f32; CHUNK * dv];
    let mut r = vec![0f32; CHUNK * CHUNK];
    let mut gamma = [0f32; CHUNK];
    let mut sx = vec![0f32; dv];
    let mut start = 0;
    while start < d.steps {
        let n = CHUNK.min(d.steps - start);
        let gate = |i: usize| g[(start + i) * d.hv + h];
        let b = |i: usize| beta[(start + i) * d.hv + h];
        let mut decayed = 1f32;
        for i in 0..n {
            decayed *= gate(i);
            gamma[i] = decayed;
            r[i * CHUNK + i] = 1.0;
            for j in (0..i).rev() {
                r[i * CHUNK + j] = r[i * CHUNK + j + 1] * gate(j + 1);
            }
        }
        // u_i, by forward substitution over the chunk's earlier u_j.
        for i in 0..n {
            let ki = key(start + i);
            let values = &v[((start + i) * d.hv + h) * dv..][..dv];
            state_times(&cols, ki, &mut sx);
            let (done, rest) = u.split_at_mut(i * dv);
            let ui = &mut rest[..dv];
            for ((out, value), s) in ui.iter_mut().zip(values).zip(&sx) {
                *out = b(i) * (value - gamma[i] * s);
            }
            for j in 0..i {
                let a = b(i) * r[i * CHUNK + j] * dot(ki, key(start + j));
                axpy(ui, -a, &done[j * dv..][..dv]);
            }
        }
        // y_i from the state before the chunk and the chunk's own updates.
        for i in 0..n {
            let qi = query(start + i);
            let yi = &mut y[(start + i) * dv..][..dv];
            state_times(&cols, qi, yi);
            for out in yi.iter_mut() {
                *out *= gamma[i];
            }
            for j in 0..=i {
                let a = r[i * CHUNK + j] * dot(qi, key(start + j));
                axpy(yi, a, &u[j * dv..][..dv]);
            }
        }
        // The state after the chunk.
        let last = n - 1;
        for s in cols.iter_mut() {
            *s *= gamma[last];
        }
        for j in 0..n {
            let kj = key(start + j);
            let uj = &u[j * dv..][..dv];
            let scale = r[last * CHUNK + j];
            for (col, &kjm) in cols.chunks_exact_mut(dv).zip(kj) {
                axpy(col, scale * kjm, uj);
            }
        }
        start += n;
    }
    from_columns(&cols, state, dk, dv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::gated_delta_host::record;
    use crate::nn::test_values::values;

    /// The chunked run against the step path on `d`, from a non-zero state:
    /// the largest difference of y and of the final state.
    fn against_steps(d: Dims, g_low: f32, g_high: f32) -> (f32, f32) {
        let (t, hk, hv, dk, dv) = (d.steps, d.hk, d.hv, d.dk, d.dv);
        // Unit-norm keys and queries scaled by Dk^-1/2, as the model feeds them.
        let unit = |n: usize, salt: f32| -> Vec<f32> {
            let mut x = values(n, salt, 1.0);
            for row in x.chunks_exact_mut(dk) {
                let norm = dot(row, row).sqrt().max(1e-6);
                row.iter_mut().for_each(|e| *e /= norm);
            }
            x
        };
        let k = unit(t * hk * dk, 0.3);
        let q: Vec<f32> = unit(t * hk * dk, 1.7)
            .iter()
            .map(|x| x / (dk as f32).sqrt())
            .collect();
        let v = values(t * hv * dv, 2.9, 1.0);
        let g: Vec<f32> = values(t * hv, 4.1, 1.0)
            .iter()
            .map(|x| g_low + (g_high - g_low) * (0.5 + 0.5 * x))
            .collect();
        let beta: Vec<f32> = values(t * hv, 5.3, 1.0)
            .iter()
            .map(|x| 0.5 + 0.5 * x)
            .collect();
        let inputs = Inputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let start = values(hv * dv * dk, 6.7, 0.5);
        let (mut stepped, mut chunked) = (start.clone(), start);
        let (y_steps, _) = record(inputs, &mut stepped, d, false);
        let y_chunks = run(inputs, &mut chunked, d);
        let max_diff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        (max_diff(&y_steps, &y_chunks), max_diff(&stepped, &chunked))
    }

    #[test]
    fn chunks_match_the_step_path_within_1e_4() {
        // Whole chunks, a short last one, fewer steps than a chunk, grouped heads.
        for steps in [CHUNK * 3, CHUNK * 2 + 7, 5, 1] {
            let d = Dims {
                steps,
                hk: 2,
                hv: 4,
                dk: 64,
                dv: 48,
            };
            let (y, state) = against_steps(d, 0.6, 1.0);
            assert!(
                y < 1e-4 && state < 1e-4,
                "{steps} steps: y {y}, state {state}"
            );
        }
    }

    #[test]
    fn decays_that_underflow_stay_finite() {
        // g of 1e-4 .. 1e-2: a chunk's cumulative decay underflows f32 to 0.
        let d = Dims {
            steps: CHUNK * 2,
            hk: 1,
            hv: 2,
            dk: 32,
            dv: 32,
        };
        let (y, state) = against_steps(d, 1e-4, 1e-2);
        assert!(y < 1e-4 && state < 1e-4, "y {y}, state {state}");
    }
}
