//! Unit tests of the host kernels, against MLX itself where MLX is the
//! reference and against scalar references for the vector kernels.

use super::*;

pub(super) fn values(n: usize, salt: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + salt) * 0.618_034).sin() * 1.3)
        .collect()
}

/// bf16 values (as f32) of a deterministic, sign-mixed sequence, some
/// of them products that land exactly on bf16 ties.
pub(super) fn bf16_values(n: usize, salt: f32, scale: f32) -> Vec<f32> {
    values(n, salt)
        .into_iter()
        .map(|v| bf16::from_f32(v * scale).to_f32())
        .collect()
}

pub(super) fn cpu() {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
}

pub(super) fn host(a: &Array) -> Vec<f32> {
    host_f32(a).unwrap()
}

/// [`round_bf16`] is MLX's f32 -> bf16 cast, ties included; [`mlx_exp`]
/// is MLX's CPU exp, bit for bit.
#[test]
fn rounding_and_exp_are_mlx_s() {
    cpu();
    let mut xs: Vec<f32> = values(5000, 0.3).iter().map(|v| v * 40.0).collect();
    // Exact ties (low 16 bits 0x8000) with even and odd kept bits.
    xs.extend([0x3F80_8000u32, 0x3F81_8000, 0xBF80_8000, 0x4000_7FFF].map(f32::from_bits));
    xs.extend([-100.0, -88.5, -87.9, 0.0, 1e-30, 87.9, 89.0]);
    let a = Array::from_slice(&xs, &[xs.len() as i32]);
    let cast = host(&a.as_dtype(Dtype::Bfloat16).unwrap());
    let ours: Vec<f32> = xs.iter().map(|&x| round_bf16(x)).collect();
    assert_eq!(ours, cast);
    let exp = host(&mlx_rs::ops::exp(&a).unwrap());
    let ours: Vec<f32> = xs.iter().map(|&x| mlx_exp(x)).collect();
    let same = ours
        .iter()
        .zip(&exp)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "exp differs");
}

/// bf16 attention is MLX's CPU scaled_dot_product_attention (its
/// fallback of bf16 ops) bit for bit, a query alone (no mask) and a
/// block (causal mask), and each query of the block is the lone query.
#[test]
fn bf16_attention_is_mlx_s_and_row_invariant() {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
    cpu();
    let (heads, kv_heads, d, total) = (6, 2, 64, 40);
    let bf = |v: Vec<f32>, shape: &[i32]| {
        Array::from_slice(&v, shape)
            .as_dtype(Dtype::Bfloat16)
            .unwrap()
    };
    let k = bf(
        values(kv_heads * total * d, 2.0),
        &[1, kv_heads as i32, total as i32, d as i32],
    );
    let v = bf(
        values(kv_heads * total * d, 3.0),
        &[1, kv_heads as i32, total as i32, d as i32],
    );
    for (len, scale) in [(1, 0.125), (16, 0.125), (16, 0.088_388_35)] {
        let q = bf(
            values(heads * len * d, 1.0)
                .iter()
                .map(|x| x * 3.0)
                .collect(),
            &[1, heads as i32, len as i32, d as i32],
        );
        let mask = (len > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let mlx = scaled_dot_product_attention(&q, &k, &v, scale, mask, None).unwrap();
        let ours = causal_attention(&q, &k, &v, scale, Arithmetic::Mlx).unwrap();
        assert_eq!(ours.dtype(), Dtype::Bfloat16);
        assert_eq!(host(&ours), host(&mlx), "{len} queries, scale {scale}");
    }
    // Row invariance: each query of a block is the query alone.
    let len = 16;
    let q = bf16_values(heads * len * d, 1.0, 1.0);
    let dims = (heads, kv_heads, len, total, d);
    let (block, lone) = block_and_lone(attention_bf16::<f32>, &q, &host(&k), &host(&v), dims);
    for (l, (_, lone)) in lone.iter().enumerate() {
        for h in 0..heads {
            assert_eq!(
                &block[(h * len + l) * d..(h * len + l + 1) * d],
                &lone[h * d..(h + 1) * d]
            );
        }
    }
}

type AttentionKernel =
    fn(&[f32], KvRows<'_, f32>, (usize, usize, usize, usize, usize), f32, &mut [f32]);
/// A query alone and its output.
type Lone = (Vec<f32>, Vec<f32>);

/// `kernel` on a block of `len` queries (scale 0.125), and on each query
/// alone over the keys up to its own position: the block's output and,
/// per query, the lone query and its output (`[heads, d]` each).
fn block_and_lone(
    kernel: AttentionKernel,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (heads, kv_heads, len, total, d): (usize, usize, usize, usize, usize),
) -> (Vec<f32>, Vec<Lone>) {
    let mut block = vec![0f32; q.len()];
    let dims = (heads, kv_heads, len, total, d);
    kernel(q, KvRows::packed(k, v, total), dims, 0.125, &mut block);
    let lone = (0..len)
        .map(|l| {
            let upto = total - len + l + 1;
            let lone_q: Vec<f32> = (0..heads)
                .flat_map(|h| q[(h * len + l) * d..(h * len + l + 1) * d].to_vec())
                .collect();
            let cut = |x: &[f32]| -> Vec<f32> {
                (0..kv_heads)
                    .flat_map(|h| x[h * total * d..(h * total + upto) * d].to_vec())
                    .collect()
            };
            let mut out = vec![0f32; heads * d];
            let dims = (heads, kv_heads, 1, upto, d);
            let (k, v) = (cut(k), cut(v));
            kernel(&lone_q, KvRows::packed(&k, &v, upto), dims, 0.125, &mut out);
            (lone_q, out)
        })
        .collect();
    (block, lone)
}

#[test]
fn the_dot_is_the_same_with_and_without_wide_registers() {
    for len in [1, 15, 16, 17, 64, 384, 1000] {
        let (a, b) = (values(len, 0.5), values(len, 7.0));
        assert_eq!(dot(&a, &b).to_bits(), dot_lanes(&a, &b).to_bits(), "{len}");
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!(
            (dot(&a, &b) as f64 - exact).abs() < 1e-4 * len as f64,
            "{len}"
        );
    }
}

#[test]
fn rows_dotted_together_are_each_rows_own_dot() {
    for len in [1, 15, 16, 17, 64, 384, 1000] {
        let w = values(len, 0.25);
        let xs: Vec<Vec<f32>> = (0..4).map(|r| values(len, 3.0 + r as f32)).collect();
        let together = dot4([&xs[0][..], &xs[1], &xs[2], &xs[3]], &w);
        for r in 0..4 {
            assert_eq!(
                together[r].to_bits(),
                dot(&xs[r], &w).to_bits(),
                "{len}, row {r}"
            );
            assert_eq!(
                together[r].to_bits(),
                dot_lanes(&xs[r], &w).to_bits(),
                "{len}, row {r}"
            );
        }
    }
}

/// Weights stored as bf16 give bit for bit the product of the same
/// values stored as f32, one row or four at a time.
#[test]
fn bf16_stored_weights_give_the_f32_product() {
    for (cols, k) in [(8, 384), (96, 1000), (33, 17)] {
        let w16: Vec<bf16> = values(cols * k, 5.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let x = values(6 * k, 2.0);
        let (mut a, mut b) = (vec![0f32; 6 * cols], vec![0f32; 6 * cols]);
        matmul_nt(&x, &w16, k, &mut a);
        matmul_nt(&x, &w32, k, &mut b);
        assert_eq!(a, b, "{cols}x{k}");
    }
}

/// Maps stacked into one product give each map's own product, bit for
/// bit, in the input's shape and dtype.
#[test]
fn stacked_maps_give_each_maps_own_product() {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let k = 384;
    let cols = [96, 8, 200];
    let parts: Vec<Array> = cols
        .iter()
        .enumerate()
        .map(|(i, &n)| Array::from_slice(&values(n * k, i as f32), &[n as i32, k as i32]))
        .collect();
    let stacked = mlx_rs::ops::concatenate(&parts, 0).unwrap();
    stacked.eval().unwrap();
    let rows = |weight: &Array| HostMatrix::rows(weight).unwrap();
    let x = Array::from_slice(&values(5 * k, 9.0), &[1, 5, k as i32])
        .as_dtype(Dtype::Bfloat16)
        .unwrap();
    let cols = cols.map(|n| n as i32);
    let split = linear_split(&x, &rows(&stacked), &cols).unwrap();
    assert_eq!(split.len(), 3);
    for (part, (weight, n)) in split.iter().zip(parts.iter().zip(cols)) {
        weight.eval().unwrap();
        let own = linear(&x, &rows(weight)).unwrap();
        assert_eq!(part.shape(), &[1, 5, n]);
        assert_eq!(part.dtype(), Dtype::Bfloat16);
        assert_eq!(host_f32(part).unwrap(), host_f32(&own).unwrap());
    }
}

/// The product's ends in one pass: [`linear_add`] is [`linear`] then
/// [`add`], and [`linear_swiglu`] is [`linear_split`] then [`swiglu`], bit
/// for bit, in bf16 and f32, for a decode step's row and a verify's 16.
#[test]
fn fused_ends_are_the_ops_one_after_the_other() {
    cpu();
    let (k, half) = (384, 1152);
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        let w = Array::from_slice(
            &bf16_values(2 * half * k, 1.0, 0.2),
            &[2 * half as i32, k as i32],
        );
        let weight = HostMatrix::columns(&w, ColumnSum::Fused).unwrap();
        let down = Array::from_slice(&bf16_values(k * half, 4.0, 0.1), &[k as i32, half as i32]);
        let down = HostMatrix::columns(&down, ColumnSum::Fused).unwrap();
        for rows in [1, 16] {
            let x = Array::from_slice(&values(rows * k, 9.0), &[1, rows as i32, k as i32])
                .as_dtype(dtype)
                .unwrap();
            let parts = linear_split(&x, &weight, &[half as i32, half as i32]).unwrap();
            let want = swiglu(&parts[0], &parts[1]).unwrap().unwrap();
            let got = linear_swiglu(&x, &weight, half).unwrap().unwrap();
            assert_eq!(got.shape(), want.shape());
            assert_eq!(got.dtype(), dtype);
            let bits = |a: &Array| {
                host_f32(a)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got), bits(&want), "swiglu, {dtype:?}, {rows} rows");
            let residual = Array::from_slice(&values(rows * k, 5.0), &[1, rows as i32, k as i32])
                .as_dtype(dtype)
                .unwrap();
            let want = add(&residual, &linear(&got, &down).unwrap())
                .unwrap()
                .unwrap();
            let sum = linear_add(&got, &down, &residual).unwrap().unwrap();
            assert_eq!(
                bits(&sum),
                bits(&want),
                "residual add, {dtype:?}, {rows} rows"
            );
        }
    }
}

/// Row i of an M-row product is bit for bit the 1-row product of row
/// i, for every M up to a verify block and a prefill chunk, on one
/// thread and on many.
#[test]
fn matmul_rows_do_not_depend_on_how_many_there_are() {
    for (cols, k) in [
        (8, 384),
        (1152, 384),
        (384, 1152),
        (3000, 64),
        (37, 1000),
        (6, 17),
    ] {
        let w = values(cols * k, 3.0);
        let x = values(80 * k, 11.0);
        let single = |m: usize| {
            let mut out = vec![0f32; cols];
            matmul_nt(&x[m * k..(m + 1) * k], &w, k, &mut out);
            out
        };
        let singles: Vec<Vec<f32>> = (0..80).map(single).collect();
        for rows in [2, 3, 5, 16, 80] {
            let mut out = vec![0f32; rows * cols];
            matmul_nt(&x[..rows * k], &w, k, &mut out);
            for m in 0..rows {
                assert_eq!(
                    out[m * cols..(m + 1) * cols],
                    singles[m][..],
                    "{cols}x{k}, {rows} rows, row {m}"
                );
            }
        }
    }
}

/// A query's output is the same attending alone (a decode step) or
/// with the rest of its block (a verify), and matches the textbook
/// softmax within f32 rounding.
#[test]
fn attention_rows_do_not_depend_on_the_block() {
    // Short and longer contexts; head widths through each path of the
    // weighted sum (64 outputs at a time, 16, one by one).
    for (d, total) in [(64, 40), (80, 150), (72, 130)] {
        attention_rows_at(6, 2, d, total, 16);
    }
}

fn attention_rows_at(heads: usize, kv_heads: usize, d: usize, total: usize, len: usize) {
    let q = values(heads * len * d, 1.0);
    let k = values(kv_heads * total * d, 2.0);
    let v = values(kv_heads * total * d, 3.0);
    let (block, lone) = block_and_lone(
        attention::<f32>,
        &q,
        &k,
        &v,
        (heads, kv_heads, len, total, d),
    );
    for (l, (lone_q, lone)) in lone.iter().enumerate() {
        // The query alone, with the keys up to its own position.
        let upto = total - len + l + 1;
        for h in 0..heads {
            let row = &block[(h * len + l) * d..(h * len + l + 1) * d];
            assert_eq!(row, &lone[h * d..(h + 1) * d], "query {l}, head {h}");
            // Textbook softmax in f64.
            let kv = h / (heads / kv_heads);
            let qr = &lone_q[h * d..(h + 1) * d];
            let scores: Vec<f64> = (0..upto)
                .map(|s| {
                    let key = &k[(kv * total + s) * d..(kv * total + s + 1) * d];
                    qr.iter()
                        .zip(key)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total_e: f64 = e.iter().sum();
            for j in 0..d {
                let want: f64 = (0..upto)
                    .map(|s| e[s] * v[(kv * total + s) * d + j] as f64)
                    .sum::<f64>()
                    / total_e;
                assert!((row[j] as f64 - want).abs() < 1e-5, "{} vs {want}", row[j]);
            }
        }
    }
}

/// Bits of an array's values (as f32).
fn bits(a: &Array) -> Vec<u32> {
    host(a).iter().map(|v| v.to_bits()).collect()
}

/// The host ops (norm, residual add, SwiGLU's gate) are MLX's CPU ops bit
/// for bit, in bf16 and in f32, over values wide enough to reach exp's
/// limits and ties.
#[test]
fn host_ops_are_mlx_s_ops() {
    cpu();
    let (rows, d) = (7usize, 384usize);
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        for scale in [0.05f32, 1.0, 30.0, 120.0] {
            let shape = [1, rows as i32, d as i32];
            let make = |salt: f32| {
                Array::from_slice(&bf16_values(rows * d, salt, scale), &shape)
                    .as_dtype(dtype)
                    .unwrap()
            };
            let (x, y) = (make(0.1), make(7.3));
            let w = Array::from_slice(&bf16_values(d, 2.9, 1.5), &[d as i32])
                .as_dtype(dtype)
                .unwrap();
            let hw = HostVector::of(&w).unwrap();
            let norm = rms_norm(&x, &hw, 1e-6).unwrap().unwrap();
            let expected = mlx_rs::fast::rms_norm(&x, Some(&w), 1e-6).unwrap();
            assert_eq!(norm.dtype(), dtype);
            assert_eq!(bits(&norm), bits(&expected), "rms_norm {dtype:?} x{scale}");
            let sum = add(&x, &y).unwrap().unwrap();
            assert_eq!(
                bits(&sum),
                bits(&x.add(&y).unwrap()),
                "add {dtype:?} x{scale}"
            );
            let gated = swiglu(&x, &y).unwrap().unwrap();
            let expected = mlx_rs::nn::silu(&x).unwrap().multiply(&y).unwrap();
            assert_eq!(bits(&gated), bits(&expected), "swiglu {dtype:?} x{scale}");
        }
    }
}

/// The mixers' output gates on the host are MLX's ops bit for bit: the
/// gated-delta layer's (cast, per-head norm, f32 silu gate, cast back)
/// and gated attention's (heads moved next to each other, sigmoid gate).
#[test]
fn host_gates_are_mlx_s_ops() {
    cpu();
    let (t, hv, dv) = (5i32, 4i32, 64i32);
    let n = (t * hv * dv) as usize;
    for scale in [0.05f32, 1.0, 30.0] {
        let y = Array::from_slice(
            &values(n, 0.7).iter().map(|v| v * scale).collect::<Vec<_>>(),
            &[1, t, hv, dv],
        );
        let z = Array::from_slice(&bf16_values(n, 3.1, scale), &[1, t, hv * dv])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let w = Array::from_slice(&bf16_values(dv as usize, 1.1, 1.0), &[dv])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let ours = gated_norm(&y, &z, &HostVector::of(&w).unwrap(), 1e-6, Dtype::Bfloat16)
            .unwrap()
            .unwrap();
        let y16 = y.as_dtype(Dtype::Bfloat16).unwrap();
        let normed = mlx_rs::fast::rms_norm(&y16, Some(&w), 1e-6).unwrap();
        let z4 = z.reshape(&[1, t, hv, dv]).unwrap();
        let expected = mlx_rs::nn::silu(z4.as_dtype(Dtype::Float32).unwrap())
            .unwrap()
            .multiply(normed.as_dtype(Dtype::Float32).unwrap())
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap()
            .reshape(&[1, t, -1])
            .unwrap();
        assert_eq!(bits(&ours), bits(&expected), "gated norm x{scale}");

        let (heads, d) = (3i32, 64i32);
        let m = (heads * t * d) as usize;
        let out = Array::from_slice(&bf16_values(m, 0.2, scale), &[1, heads, t, d])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let q_gate = Array::from_slice(&bf16_values(2 * m, 5.5, scale), &[1, t, 2 * heads * d])
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let ours = attention_gate(&out, &q_gate).unwrap().unwrap();
        let both = q_gate.reshape(&[1, t, heads, -1]).unwrap();
        let gate = mlx_rs::ops::split_equal(&both, 2, -1).unwrap()[1]
            .reshape(&[1, t, -1])
            .unwrap();
        let expected = out
            .transpose_axes(&[0, 2, 1, 3])
            .unwrap()
            .reshape(&[1, t, -1])
            .unwrap()
            .multiply(mlx_rs::ops::sigmoid(&gate).unwrap())
            .unwrap();
        assert_eq!(bits(&ours), bits(&expected), "attention gate x{scale}");
    }
}

/// Attention read in place from a [`HostKv`] (bf16 rows with room between
/// the heads, grown over several appends, one truncated) gives the bits of
/// the same rows packed as f32, for the causal, the full and MLX's
/// kernels: a host cache changes where keys live, not what is computed.
#[test]
fn attention_over_a_host_cache_is_attention_over_packed_rows() {
    let (heads, kv_heads, d, len) = (6, 2, 64, 5);
    let mut kv = HostKv::new(kv_heads, d);
    let mut packed: Vec<(Vec<f32>, Vec<f32>)> = vec![Default::default(); kv_heads];
    for (step, rows) in [7usize, 300, 1, 12].into_iter().enumerate() {
        let k = bf16_values(kv_heads * rows * d, step as f32, 2.0);
        let v = bf16_values(kv_heads * rows * d, step as f32 + 0.5, 3.0);
        kv.append(&k, &v);
        for (h, (pk, pv)) in packed.iter_mut().enumerate() {
            pk.extend_from_slice(&k[h * rows * d..(h + 1) * rows * d]);
            pv.extend_from_slice(&v[h * rows * d..(h + 1) * rows * d]);
        }
        if rows == 300 {
            kv.truncate(kv.len() - 9);
            for (pk, pv) in &mut packed {
                pk.truncate(pk.len() - 9 * d);
                pv.truncate(pv.len() - 9 * d);
            }
        }
    }
    let total = kv.len();
    assert!(kv.rows().stride > total, "room kept between the heads");
    let (pk, pv): (Vec<f32>, Vec<f32>) =
        packed
            .into_iter()
            .fold((vec![], vec![]), |(mut k, mut v), (hk, hv)| {
                k.extend(hk);
                v.extend(hv);
                (k, v)
            });
    let q = bf16_values(heads * len * d, 9.0, 1.0);
    let dims = (heads, kv_heads, len, total, d);
    for arithmetic in [Arithmetic::F32, Arithmetic::Mlx] {
        let cached = cached_attention(&q, kv.rows(), dims, 0.125, arithmetic, true);
        let flat = cached_attention(
            &q,
            KvRows::packed(&pk, &pv, total),
            dims,
            0.125,
            arithmetic,
            true,
        );
        assert_eq!(f32_bits(&cached), f32_bits(&flat), "{arithmetic:?}");
    }
    let (mut cached, mut flat) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    full_attention(&q, kv.rows(), dims, 0.125, &mut cached);
    full_attention(&q, KvRows::packed(&pk, &pv, total), dims, 0.125, &mut flat);
    assert_eq!(f32_bits(&cached), f32_bits(&flat), "full");
}

fn f32_bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// [`sigmoids`] (eight lanes at a time where the CPU has AVX2 and FMA) is
/// the scalar [`sigmoid`] bit for bit, rounded or not: on every bf16 value
/// and on every 97th f32 bit pattern (all exponents, both signs, NaNs,
/// infinities, subnormals, and the clamps at +-88 and their neighbours).
#[test]
fn sigmoids_are_the_scalar_sigmoid() {
    let mut x: Vec<f32> = (0..=u16::MAX)
        .map(|b| f32::from_bits(u32::from(b) << 16))
        .collect();
    x.extend((0..u32::MAX / 97).map(|i| f32::from_bits(i * 97)));
    for edge in [
        88.0f32,
        -88.0,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::NAN,
    ] {
        let bits = edge.to_bits();
        x.extend((bits.saturating_sub(8)..bits.saturating_add(8)).map(f32::from_bits));
    }
    let mut out = vec![0f32; x.len()];
    for round in [false, true] {
        sigmoids(&x, round, &mut out);
        for (v, got) in x.iter().zip(&out) {
            let want = sigmoid(*v, round);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "sigmoid({v:e}) round {round}"
            );
        }
    }
}
