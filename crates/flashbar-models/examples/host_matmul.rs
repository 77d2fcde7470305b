//! Times the host kernels' bf16 column products (docs/cpu.md, "The host
//! kernels") as the embedded target runs them: every map of its 6 layers
//! and the lm_head, each with its own weights (27.5 MB, so they stream from
//! memory as in a model, not from a warm cache), for 1 row (a decode step)
//! and for a verify's rows; and each shape alone, warm. Where the CPU has
//! AVX-512 BF16 the fused sums take the pair products;
//! `FLASHBAR_HOST_SIMD=avx512` times the fused kernels instead.
//!
//!     host_matmul [ROWS ...]     (default: 1 16)

use flashbar_models::nn::host::{bf16_in_pair_range, matmul_columns, to_panels, ColumnSum};
use half::bf16;
use mlx_rs::Array;
use std::time::Instant;

/// (outputs, inputs) of the embedded target's products, fused as loaded.
const GDN: [(usize, usize); 4] = [(1552, 384), (384, 512), (2304, 384), (384, 1152)];
const ATTENTION: [(usize, usize); 4] = [(1024, 384), (384, 384), (2304, 384), (384, 1152)];
const HEAD: (usize, usize) = (4096, 384);

struct Map {
    n: usize,
    k: usize,
    panels: Array,
    in_range: bool,
}

fn map((n, k): (usize, usize), salt: usize) -> Map {
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i + salt) as f32 * 0.618).sin())
        .collect();
    let panels = to_panels(&Array::from_slice(&w, &[n as i32, k as i32])).unwrap();
    let in_range = bf16_in_pair_range(panels.as_slice::<bf16>());
    Map {
        n,
        k,
        panels,
        in_range,
    }
}

/// Inputs on the bf16 grid, as the model's activations are.
fn inputs(count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| bf16::from_f32((i as f32 * 0.31).cos()).to_f32())
        .collect()
}

/// The best of 7 runs of `f`, in microseconds.
fn best(mut f: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let clock = Instant::now();
            f();
            clock.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::MAX, f64::min)
}

fn run(m: &Map, x: &[f32], out: &mut Vec<f32>) {
    let rows = x.len() / m.k;
    out.resize(rows * m.n, 0.0);
    let w = m.panels.as_slice::<bf16>();
    matmul_columns(x, w, (m.k, m.n), ColumnSum::Fused, m.in_range, out);
}

fn main() {
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("ROWS are numbers"))
        .collect();
    let rows = if rows.is_empty() { vec![1, 16] } else { rows };
    let layers = [GDN, GDN, ATTENTION, GDN, GDN, ATTENTION];
    let mut maps: Vec<Map> = Vec::new();
    for (l, shapes) in layers.iter().enumerate() {
        maps.extend(shapes.iter().enumerate().map(|(i, &s)| map(s, l * 8 + i)));
    }
    maps.push(map(HEAD, 99));
    let macs: usize = maps.iter().map(|m| m.n * m.k).sum();
    let mut out = Vec::new();
    for &r in &rows {
        let x = inputs(r * 1152);
        let us = best(|| {
            for m in &maps {
                run(m, &x[..r * m.k], &mut out);
            }
        });
        let gmacs = (r * macs) as f64 / us / 1e3;
        println!("model pass, {r:>2} rows: {us:8.1} us ({gmacs:5.1} G/s)");
    }
    for m in maps.iter().take(4).chain(&maps[8..10]).chain(maps.last()) {
        let mut line = format!("{:>5} x {:>4}, warm:", m.n, m.k);
        for &r in &rows {
            let x = inputs(r * m.k);
            let us = best(|| (0..20).for_each(|_| run(m, &x, &mut out))) / 20.0;
            let gmacs = (r * m.n * m.k) as f64 / us / 1e3;
            line += &format!("  {r} rows {us:7.1} us ({gmacs:5.1} G/s)");
        }
        println!("{line}");
    }
}
