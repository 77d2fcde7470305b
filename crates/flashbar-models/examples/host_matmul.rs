//! Times the host kernels' bf16 column products (docs/cpu.md, "The host
//! kernels") as the embedded target runs them: every map of its 6 layers
//! and the lm_head, each with its own weights (27.5 MB, so they stream from
//! memory as in a model, not from a warm cache), for 1 row (a decode step)
//! and for a verify's rows; and each shape alone, warm. Where the CPU has
//! AVX-512 BF16 the fused sums take the pair products;
//! `FLASHBAR_HOST_SIMD=avx512` times the fused kernels instead.
//!
//! Last, the ceiling: the pair-product instruction alone (`vdpbf16ps`,
//! 16 independent sums a thread, no loads) on one thread and on one
//! thread a core, in multiply-adds a second (docs/cpu.md, "The ceiling").
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

/// Multiply-adds a second of `vdpbf16ps` alone on `threads` threads at
/// once (each 16 independent sums of 32 multiply-adds an instruction, so
/// neither latency nor memory bounds it): the most any product can reach.
#[cfg(target_arch = "x86_64")]
fn ceiling(threads: usize) -> Option<f64> {
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16"))
    {
        return None;
    }
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn spin(rounds: usize) -> f32 {
        use std::arch::x86_64::*;
        let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3F80_3F80));
        let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x2000_2000));
        let mut acc = [_mm512_setzero_ps(); 16];
        for _ in 0..rounds {
            for sum in acc.iter_mut() {
                *sum = _mm512_dpbf16_ps(*sum, a, b);
            }
        }
        acc.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
    }
    let rounds = 2_000_000;
    let best = (0..5)
        .map(|_| {
            let clock = Instant::now();
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    // SAFETY: the CPU has AVX-512F and BF16 (checked above).
                    scope.spawn(|| std::hint::black_box(unsafe { spin(rounds) }));
                }
            });
            clock.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    Some((threads * rounds * 16 * 32) as f64 / best / 1e9)
}

#[cfg(not(target_arch = "x86_64"))]
fn ceiling(_threads: usize) -> Option<f64> {
    None
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
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, cores] {
        match ceiling(threads) {
            Some(g) => println!("vdpbf16ps alone, {threads} thread(s): {g:6.1} G/s"),
            None => println!("vdpbf16ps: not on this CPU"),
        }
    }
}
