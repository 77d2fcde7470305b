//! Times the host kernels' bf16 column product (docs/cpu.md, "The host
//! kernels") at the embedded target's shapes, for 1 row and for a verify's
//! rows: what an M-row product costs against M one-row products.
//!
//!     host_matmul [ROWS ...]     (default: 1 16)

use flashbar_models::nn::host::{matmul_columns, to_panels, ColumnSum};
use half::bf16;
use mlx_rs::Array;
use std::time::Instant;

/// (outputs, inputs) of the embedded target's products, fused as loaded.
const SHAPES: [(usize, usize); 7] = [
    (1552, 384), // gated-delta in_proj (qkv, z, b, a)
    (384, 512),  // gated-delta out_proj
    (1024, 384), // attention q (with gate), k, v
    (384, 384),  // attention o_proj
    (2304, 384), // MLP gate and up
    (384, 1152), // MLP down
    (4096, 384), // lm_head
];

fn main() {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("ROWS are numbers"))
        .collect();
    let rows = if rows.is_empty() { vec![1, 16] } else { rows };
    for (n, k) in SHAPES {
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.618).sin()).collect();
        let panels = to_panels(&Array::from_slice(&w, &[n as i32, k as i32])).unwrap();
        let panels = panels.as_slice::<bf16>();
        let mut line = format!("{n:>5} x {k:>4}:");
        for &m in &rows {
            let x: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.31).cos()).collect();
            let mut out = vec![0f32; m * n];
            let mut best = f64::MAX;
            for _ in 0..7 {
                let clock = Instant::now();
                for _ in 0..20 {
                    matmul_columns(&x, panels, k, n, ColumnSum::F32, &mut out);
                }
                best = best.min(clock.elapsed().as_secs_f64() / 20.0);
            }
            let gmacs = (m * n * k) as f64 / best / 1e9;
            line += &format!("  {m} rows {:7.1} us ({gmacs:5.1} G/s)", best * 1e6);
        }
        println!("{line}");
    }
}
