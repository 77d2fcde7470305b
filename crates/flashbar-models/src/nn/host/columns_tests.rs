//! Unit tests of the column kernels (`columns.rs`, `columns_x86.rs`,
//! `columns_pairs.rs`): every vector kernel and blocking against its
//! scalar reference, the bf16 pair products and their range, and the
//! column sums against MLX's own CPU kernels.

use super::tests::{bf16_values, cpu, host, values};
use super::*;

/// Every vector kernel, at every blocking and tail, gives its scalar
/// reference's bits: AVX-512, AVX2 and scalar machines agree, and so row
/// i of an M-row product is the 1-row product of row i for every M (the
/// row blocks of 16, 8, 4 and 1, and an odd panel at the end).
#[test]
fn column_kernels_equal_their_scalar_reference() {
    column_kernels_at(&[(16, 64), (100, 37), (4096, 24), (72, 384), (48, 40)]);
}

/// [`column_kernels_equal_their_scalar_reference`] at the embedded pair's
/// shapes, fused as loaded (docs/cpu.md, "The host kernels"): a gated-delta
/// layer's in_proj and out_proj, attention's qkv and o_proj, the MLP's
/// gate/up and down, the lm_head, the drafter's fc.
#[test]
fn column_kernels_equal_their_scalar_reference_at_the_model_shapes() {
    column_kernels_at(&[
        (1552, 384),
        (384, 512),
        (1024, 384),
        (384, 384),
        (2304, 384),
        (384, 1152),
        (4096, 384),
    ]);
}

fn column_kernels_at(shapes: &[(usize, usize)]) {
    cpu();
    for &(n, k) in shapes {
        let w = Array::from_slice(&bf16_values(n * k, 1.0, 0.7), &[n as i32, k as i32]);
        let panels = to_panels(&w).unwrap();
        let panels = panels.as_slice::<bf16>();
        for rows in [1, 2, 3, 4, 5, 6, 8, 9, 12, 15, 16, 17, 24, 31, 32] {
            // Inputs off the bf16 grid: the product of two bf16 values is
            // exact in f32, so with bf16 inputs a fused multiply-add gives
            // a multiply and an add's bits and the sums could not be told
            // apart.
            let x = values(rows * k, 2.0);
            for sum in [ColumnSum::Bf16, ColumnSum::F32, ColumnSum::Fused] {
                let want: Vec<f32> = (0..rows)
                    .flat_map(|m| {
                        let row = &x[m * k..(m + 1) * k];
                        (0..n).map(move |c| column_scalar(row, panels, c, sum))
                    })
                    .collect();
                for kernels in [Simd::Scalar, Simd::Avx2, Simd::Avx512] {
                    #[cfg(target_arch = "x86_64")]
                    if (kernels == Simd::Avx2 && !std::is_x86_feature_detected!("avx2"))
                        || (kernels == Simd::Avx512 && !std::is_x86_feature_detected!("avx512f"))
                    {
                        continue;
                    }
                    let mut out = vec![0f32; rows * n];
                    columns_range(
                        &x,
                        k,
                        panels,
                        (0, n),
                        sum,
                        Outputs::new(&mut out, n),
                        kernels,
                        None,
                    );
                    let same = out
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{n}x{k}, {rows} rows, {sum:?}");
                }
                let mut out = vec![0f32; rows * n];
                matmul_columns(
                    &x,
                    panels,
                    (k, n),
                    sum,
                    bf16_in_pair_range(panels),
                    &mut out,
                );
                assert_eq!(out, want, "{n}x{k}, {rows} rows, {sum:?}, threaded");
            }
            #[cfg(target_arch = "x86_64")]
            pair_products_at(panels, (n, k), rows);
        }
    }
}

/// Where this CPU has the bf16 pair products (docs/cpu.md, "bf16 pair
/// products"): on bf16 inputs, the models' activations, every blocking of
/// them gives the fused sums' bits, alone and threaded through
/// [`matmul_columns`], which takes them there.
#[cfg(target_arch = "x86_64")]
fn pair_products_at(panels: &[bf16], (n, k): (usize, usize), rows: usize) {
    if simd() != Simd::Avx512Bf16 || k % 2 == 1 {
        return;
    }
    let x = bf16_values(rows * k, 2.0, 1.9);
    let want: Vec<f32> = (0..rows)
        .flat_map(|m| {
            let row = &x[m * k..(m + 1) * k];
            (0..n).map(move |c| column_scalar(row, panels, c, ColumnSum::Fused))
        })
        .collect();
    let mut out = vec![0f32; rows * n];
    columns_range(
        &x,
        k,
        panels,
        (0, n),
        ColumnSum::Fused,
        Outputs::new(&mut out, n),
        Simd::Avx512Bf16,
        Some(&columns_pairs::pair_words(&x)),
    );
    let same = out
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{n}x{k}, {rows} rows, pair products");
    assert!(pairs_apply(
        &x,
        k,
        ColumnSum::Fused,
        bf16_in_pair_range(panels)
    ));
    let mut out = vec![0f32; rows * n];
    matmul_columns(&x, panels, (k, n), ColumnSum::Fused, true, &mut out);
    assert_eq!(out, want, "{n}x{k}, {rows} rows, pair products threaded");
}

/// The range the pair products take: bf16 values (as f32) that are zero or
/// of a magnitude 2^-56 to below 2^49; nothing off the bf16 grid, nothing
/// that could make a subnormal or infinite product or sum.
#[test]
fn the_pair_range_takes_bf16_values_of_ordinary_magnitude() {
    let p = |e: i32| 2f32.powi(e);
    for ok in [
        0.0,
        -0.0,
        1.0,
        -3.5,
        p(-56),
        -p(-56),
        p(48) * 1.5,
        0.007_812_5,
    ] {
        assert!(in_pair_range(&[ok]), "{ok:e}");
        assert!(bf16_in_pair_range(&[bf16::from_f32(ok)]), "{ok:e}");
    }
    for bad in [
        p(-57),
        p(49),
        f32::INFINITY,
        f32::NAN,
        p(-130),
        1.0 + p(-10),
    ] {
        assert!(!in_pair_range(&[1.0, bad]), "{bad:e}");
    }
    for bad in [p(-57), p(49), f32::INFINITY, p(-130)] {
        assert!(!bf16_in_pair_range(&[bf16::from_f32(bad)]), "{bad:e}");
    }
}

/// Why the range is checked: with an input whose products fall below f32's
/// normal range, the pair products (which flush subnormals to zero) give
/// other bits than the fused sums, and [`matmul_columns`] therefore takes
/// the fused kernels for it.
#[test]
#[cfg(target_arch = "x86_64")]
fn subnormal_products_keep_the_fused_kernels() {
    if simd() != Simd::Avx512Bf16 {
        return;
    }
    let (n, k, rows) = (32, 64, 4);
    let w: Vec<f32> = bf16_values(n * k, 1.0, 0.7)
        .iter()
        .map(|v| v * 2f32.powi(-60))
        .collect();
    let panels = to_panels(&Array::from_slice(&w, &[n as i32, k as i32])).unwrap();
    let panels = panels.as_slice::<bf16>();
    let x: Vec<f32> = bf16_values(rows * k, 2.0, 1.9)
        .iter()
        .map(|v| v * 2f32.powi(-70))
        .collect();
    let want: Vec<f32> = (0..rows)
        .flat_map(|m| {
            let row = &x[m * k..(m + 1) * k];
            (0..n).map(move |c| column_scalar(row, panels, c, ColumnSum::Fused))
        })
        .collect();
    assert!(
        want.iter().any(|v| *v != 0.0),
        "the fused sums keep the subnormal products"
    );
    let mut forced = vec![0f32; rows * n];
    columns_range(
        &x,
        k,
        panels,
        (0, n),
        ColumnSum::Fused,
        Outputs::new(&mut forced, n),
        Simd::Avx512Bf16,
        Some(&columns_pairs::pair_words(&x)),
    );
    assert_ne!(forced, want, "pair products flush what the fused sums keep");
    assert!(!pairs_apply(
        &x,
        k,
        ColumnSum::Fused,
        bf16_in_pair_range(panels)
    ));
    let mut out = vec![0f32; rows * n];
    matmul_columns(
        &x,
        panels,
        (k, n),
        ColumnSum::Fused,
        bf16_in_pair_range(panels),
        &mut out,
    );
    assert_eq!(out, want);
}

/// With bf16 inputs (the models' activations) each product of two bf16
/// values is exact in f32, so the fused sum has the bits of a multiply and
/// an add: the default arithmetic's outputs did not change when its
/// kernels began to fuse them (docs/cpu.md, "Fused multiply-adds"). Off
/// the bf16 grid the two differ, so the comparison can fail.
#[test]
fn fused_sums_of_bf16_inputs_are_the_unfused_sums() {
    cpu();
    let (n, k) = (2304, 384);
    let w = Array::from_slice(&bf16_values(n * k, 1.0, 0.7), &[n as i32, k as i32]);
    let panels = to_panels(&w).unwrap();
    let panels = panels.as_slice::<bf16>();
    let product = |x: &[f32], sum| {
        let mut out = vec![0f32; x.len() / k * n];
        matmul_columns(x, panels, (k, n), sum, bf16_in_pair_range(panels), &mut out);
        out
    };
    for rows in [1, 16] {
        let x = bf16_values(rows * k, 2.0, 1.9);
        assert_eq!(product(&x, ColumnSum::Fused), product(&x, ColumnSum::F32));
        let x = values(rows * k, 2.0);
        assert_ne!(product(&x, ColumnSum::Fused), product(&x, ColumnSum::F32));
    }
}

/// The two column sums are MLX's CPU kernels for bf16 inputs: its
/// quantized matmul (bf16 scales) and its bf16 gemm, bit for bit.
#[test]
fn column_sums_are_mlx_cpu_kernels_for_bf16() {
    cpu();
    let (n, k, rows) = (200, 256, 5);
    let w = Array::from_slice(&values(n * k, 3.0), &[n as i32, k as i32])
        .as_dtype(Dtype::Bfloat16)
        .unwrap();
    let x = Array::from_slice(&bf16_values(rows * k, 4.0, 2.0), &[rows as i32, k as i32])
        .as_dtype(Dtype::Bfloat16)
        .unwrap();
    let (packed, scales, biases) = mlx_rs::ops::quantize(&w, 64, 8).unwrap();
    assert_eq!(scales.dtype(), Dtype::Bfloat16);
    let dequantized = mlx_rs::ops::dequantize(&packed, &scales, &biases, 64, 8).unwrap();
    let mlx = mlx_rs::ops::quantized_matmul(&x, &packed, &scales, &biases, true, 64, 8).unwrap();
    let ours = linear(
        &x,
        &HostMatrix::columns(&dequantized, ColumnSum::Bf16).unwrap(),
    )
    .unwrap();
    assert_eq!(host(&ours), host(&mlx), "quantized matmul");
    // An f32 sum of the same values is not it: the test tells them apart.
    let f32_sum = linear(&x, &HostMatrix::rows(&dequantized).unwrap()).unwrap();
    assert_ne!(host(&f32_sum), host(&mlx));

    let mlx = mlx_rs::ops::matmul(&x, w.t()).unwrap();
    let ours = linear(&x, &HostMatrix::columns(&w, ColumnSum::F32).unwrap()).unwrap();
    assert_eq!(host(&ours), host(&mlx), "bf16 gemm");
}
