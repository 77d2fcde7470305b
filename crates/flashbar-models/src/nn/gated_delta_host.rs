//! The gated delta recurrence on the CPU, in Rust over evaluated arrays:
//! one function for every T (decode, verify, prefill) and its replay, so a
//! T-token verify equals T one-token steps bit for bit and a rollback
//! reaches exactly the state that decoding the kept prefix reaches
//! (docs/cpu.md; the maths in docs/dflash.md). Per value head h, step t,
//! row r of the state S `[Dv, Dk]`:
//!
//!   S[r] <- g S[r];  d = beta (v[r] - S[r].k);  S[r] <- S[r] + d k;  y[r] = S[r].q
//!
//! The replay repeats the first and third lines with the recorded d: the
//! same operations in the same order, so the same bits.
//!
//! The operations and their order are mlx-lm's on the CPU (its per-step
//! `_gated_delta_step_ops`): each product rounded to f32, the two dots summed
//! in key order from zero, `S + k d` as a product then a sum, so y and the
//! state are bit for bit mlx-lm's (docs/cpu.md, "Parity with mlx-lm").

use crate::error::Result;
use crate::nn::gated_delta_chunked;
use crate::nn::host::pool;
use crate::nn::host::{self, host_f32};
use mlx_rs::Array;

/// Sizes: steps, key heads, value heads, key and value head dims.
#[derive(Clone, Copy)]
pub struct Dims {
    pub steps: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Dims {
    /// The conv's channels: q, k (`Hk x Dk` each) and v (`Hv x Dv`).
    pub fn conv_channels(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }

    /// From keys `[1, T, Hk, Dk]` and anything shaped per value `[1, T, Hv, Dv]`.
    fn of(k: &Array, per_value: &Array) -> Self {
        let (ks, vs) = (k.shape(), per_value.shape());
        Dims {
            steps: ks[1] as usize,
            hk: ks[2] as usize,
            hv: vs[2] as usize,
            dk: ks[3] as usize,
            dv: vs[3] as usize,
        }
    }
}

/// One step range's inputs, row-major: q, k `[T, Hk, Dk]`; v `[T, Hv, Dv]`;
/// g, beta `[T, Hv]`.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// One head's share: its index, state `[Dv, Dk]`, y rows and delta rows.
type HeadJob<'a> = (
    usize,
    ((&'a mut [f32], &'a mut [f32]), Option<&'a mut [f32]>),
);

/// Heads times steps times state size below which one thread runs it.
const PARALLEL_FROM: usize = 1 << 17;

host::vectorized! {
    /// One value head over every step. `state` is that head's `[Dv, Dk]`, or
    /// already `[Dk, Dv]` by `layout`; `y` and `delta` its rows `[T, Dv]`
    /// (laid out per head, gathered after).
    /// The state is worked on by columns (`[Dk, Dv]`): every loop runs over
    /// the rows innermost, so it vectorises, while each row still decays, dots
    /// (in key order, from zero) and updates exactly as written in the module
    /// comment. Compiled for wide registers where the CPU has them
    /// ([`host::vectorized`]: the same bits).
    fn head(
        h: usize,
        d: Dims,
        inputs: Inputs,
        state: &mut [f32],
        layout: Layout,
        y: &mut [f32],
        delta: Option<&mut [f32]>,
    ) {
        let Inputs { q, k, v, g, beta } = inputs;
        let mut delta = delta;
        let kh = h / (d.hv / d.hk);
        let (dk, dv) = (d.dk, d.dv);
        let mut by_rows = (layout == Layout::Rows).then(|| to_columns(state, dk, dv));
        let cols: &mut [f32] = match by_rows.as_mut() {
            Some(cols) => cols,
            None => &mut *state,
        };
        let (mut kv, mut step, mut out) = (vec![0f32; dv], vec![0f32; dv], vec![0f32; dv]);
        for t in 0..d.steps {
            let key = &k[(t * d.hk + kh) * dk..][..dk];
            let query = &q[(t * d.hk + kh) * dk..][..dk];
            let values = &v[(t * d.hv + h) * dv..][..dv];
            let (gate, b) = (g[t * d.hv + h], beta[t * d.hv + h]);
            // Each column decayed, then added into S k (the dots still
            // summed in key order over decayed values): one pass, not two.
            kv.fill(0.0);
            for (col, &kj) in cols.chunks_exact_mut(dv).zip(key) {
                for (acc, s) in kv.iter_mut().zip(col) {
                    *s *= gate;
                    *acc += *s * kj;
                }
            }
            for ((st, value), acc) in step.iter_mut().zip(values).zip(&kv) {
                *st = (value - acc) * b;
            }
            // Each column updated, then added into S q, likewise.
            out.fill(0.0);
            for ((col, &kj), &qj) in cols.chunks_exact_mut(dv).zip(key).zip(query) {
                for ((acc, s), st) in out.iter_mut().zip(col).zip(&step) {
                    *s += kj * st;
                    *acc += *s * qj;
                }
            }
            y[t * dv..(t + 1) * dv].copy_from_slice(&out);
            if let Some(delta) = delta.as_deref_mut() {
                delta[t * dv..(t + 1) * dv].copy_from_slice(&step);
            }
        }
        if let Some(cols) = &by_rows {
            from_columns(cols, state, dk, dv);
        }
    }
}

/// How a recurrent state `[Hv, ...]` holds each head: by rows `[Dv, Dk]`
/// (the model's layout, MLX's) or by columns `[Dk, Dv]`, the layout the
/// recurrence works in, which the host cache keeps between steps so that no
/// step transposes it (`gated_delta_head::HostState`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Columns,
}

/// `state`, laid out the other way: by `to`, from the other layout.
pub fn relaid(state: &[f32], d: Dims, to: Layout) -> Vec<f32> {
    let per_head = d.dv * d.dk;
    let mut out = vec![0f32; state.len()];
    for (from, into) in state
        .chunks_exact(per_head)
        .zip(out.chunks_exact_mut(per_head))
    {
        match to {
            Layout::Columns => into.copy_from_slice(&to_columns(from, d.dk, d.dv)),
            Layout::Rows => from_columns(from, into, d.dk, d.dv),
        }
    }
    out
}

/// Steps from which a run with no tape (a prefill: decode and verify never
/// have this many) goes chunk by chunk ([`gated_delta_chunked`]), in the
/// f32 arithmetic; MLX's arithmetic keeps mlx-lm's step order.
pub const CHUNKED_FROM: usize = 64;

/// A head's state `[Dv, Dk]` by columns, `[Dk, Dv]`: passes over it then
/// run along the value rows, innermost, and vectorise.
pub(super) fn to_columns(state: &[f32], dk: usize, dv: usize) -> Vec<f32> {
    let mut cols = vec![0f32; dk * dv];
    for (r, row) in state.chunks_exact(dk).enumerate() {
        for (j, &s) in row.iter().enumerate() {
            cols[j * dv + r] = s;
        }
    }
    cols
}

/// [`to_columns`] undone, into `state`.
pub(super) fn from_columns(cols: &[f32], state: &mut [f32], dk: usize, dv: usize) {
    for (r, row) in state.chunks_exact_mut(dk).enumerate() {
        for (j, s) in row.iter_mut().enumerate() {
            *s = cols[j * dv + r];
        }
    }
}

/// Runs the recurrence over all steps of `inputs` from `state` `[Hv, Dv,
/// Dk]`, advanced in place. Returns y `[T, Hv, Dv]` and, when `record`,
/// every step's d `[T, Hv, Dv]`.
pub fn record(
    inputs: Inputs,
    state: &mut [f32],
    d: Dims,
    record: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    record_in(inputs, state, Layout::Rows, d, record)
}

/// [`record`] for a state laid out per head by `layout`.
pub fn record_in(
    inputs: Inputs,
    state: &mut [f32],
    layout: Layout,
    d: Dims,
    record: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    if !record && d.steps >= CHUNKED_FROM && host::arithmetic() == host::Arithmetic::F32 {
        if layout == Layout::Rows {
            return (gated_delta_chunked::run(inputs, state, d), None);
        }
        // A long prefill: the chunked path takes rows.
        let mut rows = relaid(state, d, Layout::Rows);
        let y = gated_delta_chunked::run(inputs, &mut rows, d);
        state.copy_from_slice(&relaid(&rows, d, Layout::Columns));
        return (y, None);
    }
    let per_head = d.steps * d.dv;
    let mut y = vec![0f32; d.hv * per_head];
    let mut delta = record.then(|| vec![0f32; d.hv * per_head]);
    let work = |(h, ((s, y), delta)): HeadJob| head(h, d, inputs, s, layout, y, delta);
    let states = state.chunks_exact_mut(d.dv * d.dk);
    let ys = y.chunks_exact_mut(per_head);
    let deltas: Vec<Option<&mut [f32]>> = match &mut delta {
        Some(all) => all.chunks_exact_mut(per_head).map(Some).collect(),
        None => (0..d.hv).map(|_| None).collect(),
    };
    let jobs: Vec<_> = states.zip(ys).zip(deltas).enumerate().collect();
    if d.hv * d.steps * d.dv * d.dk < PARALLEL_FROM {
        jobs.into_iter().for_each(work);
    } else {
        pool::each(jobs, work);
    }
    // Per-head rows [Hv, T, Dv] to the model's [T, Hv, Dv].
    let to_steps = |per: Vec<f32>| -> Vec<f32> {
        let mut out = vec![0f32; per.len()];
        for h in 0..d.hv {
            for t in 0..d.steps {
                out[(t * d.hv + h) * d.dv..][..d.dv]
                    .copy_from_slice(&per[h * per_head + t * d.dv..][..d.dv]);
            }
        }
        out
    };
    (to_steps(y), delta.map(to_steps))
}

/// The state after the first `steps` recorded steps, from the state before
/// them: S[r] <- g S[r]; S[r] <- S[r] + d k, exactly as [`record`] did
/// (by way of [`replay_columns`]: each value on its own, so the same bits).
pub fn replay(state: &mut [f32], k: &[f32], g: &[f32], delta: &[f32], d: Dims, steps: usize) {
    let mut cols = relaid(state, d, Layout::Columns);
    replay_columns(&mut cols, k, g, delta, d, steps);
    state.copy_from_slice(&relaid(&cols, d, Layout::Rows));
}

host::vectorized! {
    /// [`replay`] for a state by columns (`Layout::Columns`): per step, each
    /// value decayed by g, then d k added, every value on its own.
    pub fn replay_columns(state: &mut [f32], k: &[f32], g: &[f32], delta: &[f32], d: Dims, steps: usize) {
        for (h, cols) in state.chunks_exact_mut(d.dv * d.dk).enumerate() {
            let kh = h / (d.hv / d.hk);
            for t in 0..steps {
                let key = &k[(t * d.hk + kh) * d.dk..][..d.dk];
                let gate = g[t * d.hv + h];
                let steps = &delta[(t * d.hv + h) * d.dv..][..d.dv];
                for (col, &kk) in cols.chunks_exact_mut(d.dv).zip(key) {
                    for (s, &step) in col.iter_mut().zip(steps) {
                        *s *= gate;
                        *s += kk * step;
                    }
                }
            }
        }
    }
}

/// [`record`] for MLX arrays of one batch row (shapes as in
/// `gated_delta::recurrence`, B = 1): y, the new state, and the deltas
/// when `record`; all f32.
pub fn record_arrays(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    record_tape: bool,
) -> Result<(Array, Array, Option<Array>)> {
    let d = Dims::of(k, v);
    let (qh, kh, vh) = (host_f32(q)?, host_f32(k)?, host_f32(v)?);
    let (gh, bh) = (host_f32(g)?, host_f32(beta)?);
    let mut s = host_f32(state)?;
    let inputs = Inputs {
        q: &qh,
        k: &kh,
        v: &vh,
        g: &gh,
        beta: &bh,
    };
    let (y, delta) = record(inputs, &mut s, d, record_tape);
    let steps = [1, d.steps as i32, d.hv as i32, d.dv as i32];
    Ok((
        Array::from_slice(&y, &steps),
        Array::from_slice(&s, state.shape()),
        delta.map(|delta| Array::from_slice(&delta, &steps)),
    ))
}

/// [`replay`] for MLX arrays: the state after `steps` of the tape.
pub fn replay_arrays(
    state: &Array,
    k: &Array,
    g: &Array,
    delta: &Array,
    steps: i32,
) -> Result<Array> {
    let d = Dims::of(k, delta);
    let mut s = host_f32(state)?;
    replay(
        &mut s,
        &host_f32(k)?,
        &host_f32(g)?,
        &host_f32(delta)?,
        d,
        steps as usize,
    );
    Ok(Array::from_slice(&s, state.shape()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::test_values::values;

    const D: Dims = Dims {
        steps: 16,
        hk: 2,
        hv: 4,
        dk: 32,
        dv: 24,
    };

    fn inputs(d: Dims) -> [Vec<f32>; 5] {
        let gate: Vec<f32> = values(d.steps * d.hv, 4.0, 0.1)
            .iter()
            .map(|x| 0.9 + x)
            .collect();
        let beta: Vec<f32> = values(d.steps * d.hv, 5.0, 0.4)
            .iter()
            .map(|x| 0.5 + x)
            .collect();
        [
            values(d.steps * d.hk * d.dk, 1.0, 0.3),
            values(d.steps * d.hk * d.dk, 2.0, 0.3),
            values(d.steps * d.hv * d.dv, 3.0, 1.0),
            gate,
            beta,
        ]
    }

    fn view(x: &[Vec<f32>; 5]) -> Inputs<'_> {
        let [q, k, v, g, beta] = x;
        Inputs { q, k, v, g, beta }
    }

    fn step_slice(x: &[f32], per_step: usize, t: usize) -> &[f32] {
        &x[t * per_step..(t + 1) * per_step]
    }

    /// T steps at once equal T one-step calls bit for bit (y, state and
    /// the deltas), and the replay of any prefix reaches the state those
    /// steps reached.
    #[test]
    fn a_block_equals_its_steps_and_replay_equals_the_prefix() {
        let x = inputs(D);
        let [q, k, v, g, beta] = &x;
        let start = values(D.hv * D.dv * D.dk, 9.0, 0.2);
        let mut block_state = start.clone();
        let all = view(&x);
        let (y, delta) = record(all, &mut block_state, D, true);
        let delta = delta.unwrap();

        let one = Dims { steps: 1, ..D };
        let mut state = start.clone();
        let mut states = vec![start.clone()];
        for t in 0..D.steps {
            let (qk, vd, h) = (D.hk * D.dk, D.hv * D.dv, D.hv);
            let step = Inputs {
                q: step_slice(q, qk, t),
                k: step_slice(k, qk, t),
                v: step_slice(v, vd, t),
                g: step_slice(g, h, t),
                beta: step_slice(beta, h, t),
            };
            let (y1, d1) = record(step, &mut state, one, true);
            assert_eq!(y1, step_slice(&y, vd, t), "y at step {t}");
            assert_eq!(d1.unwrap(), step_slice(&delta, vd, t), "delta at step {t}");
            states.push(state.clone());
        }
        assert_eq!(state, block_state);
        for kept in [0, 1, 7, 15, 16] {
            let mut replayed = start.clone();
            replay(&mut replayed, k, g, &delta, D, kept);
            assert_eq!(replayed, states[kept], "replay of {kept} steps");
        }
    }

    /// A state kept by columns gives the bits a state by rows gives: the
    /// same y, deltas and (laid back) state, with and without a tape, and in
    /// a prefill long enough for the chunked path. (The replay is one
    /// function for both layouts, checked in the test above.)
    #[test]
    fn a_state_by_columns_is_a_state_by_rows() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (steps, tape) in [
            (1, true),
            (16, true),
            (16, false),
            (CHUNKED_FROM + 3, false),
        ] {
            let d = Dims { steps, ..D };
            let x = inputs(d);
            let all = view(&x);
            let start = values(d.hv * d.dv * d.dk, 9.0, 0.2);
            let mut rows = start.clone();
            let mut cols = relaid(&start, d, Layout::Columns);
            assert_eq!(bits(&relaid(&cols, d, Layout::Rows)), bits(&start));
            let (y_rows, delta_rows) = record(all, &mut rows, d, tape);
            let (y_cols, delta_cols) = record_in(all, &mut cols, Layout::Columns, d, tape);
            assert_eq!(bits(&y_cols), bits(&y_rows), "y, {steps} steps");
            assert_eq!(
                delta_cols.as_deref().map(bits),
                delta_rows.as_deref().map(bits),
                "deltas, {steps} steps"
            );
            assert_eq!(
                bits(&relaid(&cols, d, Layout::Rows)),
                bits(&rows),
                "state, {steps} steps"
            );
        }
    }

    /// The host recurrence is the MLX-ops one (`gated_delta::recurrence`,
    /// mlx-lm's `gated_delta_ops` order) bit for bit: y, state, deltas.
    #[test]
    fn it_is_the_mlx_ops_recurrence_bit_for_bit() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let x = inputs(D);
        let [q, k, v, g, beta] = &x;
        let start = values(D.hv * D.dv * D.dk, 9.0, 0.2);
        let arr = |x: &[f32], shape: &[usize]| {
            let shape: Vec<i32> = shape.iter().map(|&s| s as i32).collect();
            Array::from_slice(x, &shape)
        };
        let (t, hk, hv, dk, dv) = (D.steps, D.hk, D.hv, D.dk, D.dv);
        let (qa, ka) = (arr(q, &[1, t, hk, dk]), arr(k, &[1, t, hk, dk]));
        let (va, ga, ba) = (
            arr(v, &[1, t, hv, dv]),
            arr(g, &[1, t, hv]),
            arr(beta, &[1, t, hv]),
        );
        let sa = arr(&start, &[1, hv, dv, dk]);
        let (y0, s0, d0) =
            crate::nn::gated_delta::recurrence(&qa, &ka, &va, &ga, &ba, sa.clone(), true).unwrap();
        let (y1, s1, d1) = record_arrays(&qa, &ka, &va, &ga, &ba, &sa, true).unwrap();
        assert_eq!(host_f32(&y1).unwrap(), host_f32(&y0).unwrap(), "y");
        assert_eq!(host_f32(&s1).unwrap(), host_f32(&s0).unwrap(), "state");
        assert_eq!(
            host_f32(&d1.unwrap()).unwrap(),
            host_f32(&d0.unwrap()).unwrap(),
            "deltas"
        );
    }

    /// The recurrence as written in docs/dflash.md, in f64, agrees.
    #[test]
    fn it_computes_the_recurrence() {
        let x = inputs(D);
        let [q, k, v, g, beta] = &x;
        let mut state = vec![0f32; D.hv * D.dv * D.dk];
        let all = view(&x);
        let (y, _) = record(all, &mut state, D, false);
        let mut s = vec![0f64; D.hv * D.dv * D.dk];
        for t in 0..D.steps {
            for h in 0..D.hv {
                let kh = h / (D.hv / D.hk);
                let key = &k[(t * D.hk + kh) * D.dk..][..D.dk];
                let query = &q[(t * D.hk + kh) * D.dk..][..D.dk];
                for r in 0..D.dv {
                    let row = &mut s[(h * D.dv + r) * D.dk..][..D.dk];
                    row.iter_mut().for_each(|x| *x *= g[t * D.hv + h] as f64);
                    let kv: f64 = row.iter().zip(key).map(|(a, b)| a * *b as f64).sum();
                    let step =
                        (v[(t * D.hv + h) * D.dv + r] as f64 - kv) * beta[t * D.hv + h] as f64;
                    row.iter_mut()
                        .zip(key)
                        .for_each(|(x, kk)| *x += *kk as f64 * step);
                    let want: f64 = row.iter().zip(query).map(|(a, b)| a * *b as f64).sum();
                    let got = y[(t * D.hv + h) * D.dv + r] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "t {t} h {h} r {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
