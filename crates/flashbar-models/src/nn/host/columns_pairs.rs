//! The default arithmetic's column products ([`ColumnSum::Fused`]) by
//! AVX-512 BF16 pair products (`vdpbf16ps`), where the CPU has them:
//! the same bits as the fused multiply-adds, twice the multiply-adds an
//! instruction (docs/cpu.md, "bf16 pair products").
//!
//! One `vdpbf16ps` lane takes a 32-bit word of two bf16 values from each
//! operand and adds their two products to its f32 sum one after the
//! other, the high halves' first, each add rounded once to nearest with
//! the product exact (two bf16 values multiply exactly in f32): two steps
//! of a fused multiply-add chain. So a lane whose words hold steps `2t`
//! (high half) and `2t + 1` (low half) of its column sums in k order, as
//! [`column_scalar`] does. What differs is only outside the models'
//! range: the instruction reads and writes subnormals as zero. Inputs and
//! weights whose every non-zero value lies in [`PAIR_RANGE`] never make a
//! subnormal product or partial sum (nor an infinite one), so there the
//! bits are the fused sums' for every input; the callers check that range
//! ([`pairs_apply`]) and take the fused kernels outside it.

use super::*;

/// Whether this CPU runs the pair products and they give the fused sums'
/// bits here: checked once per process on inputs that tell the orders
/// apart ([`self_check`]), so a CPU that implemented the instruction
/// otherwise would keep the fused kernels.
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && self_check()
    })
}

/// The pair products against [`column_scalar`]'s fused sums on 8 rows by
/// 3 panels whose products span 2^50 in magnitude and cancel, so that
/// another order or rounding of the two products would show.
fn self_check() -> bool {
    let (k, n, rows) = (64usize, 3 * PANEL, 9usize);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut value = |spread: u32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let exponent = 127 - 25 + (state % u64::from(spread)) as u32;
        let sign = ((state >> 20) & 1) as u32;
        f32::from_bits((sign << 31) | (exponent << 23) | ((state >> 32) as u32 & 0x7F_0000))
    };
    let w: Vec<bf16> = (0..n * k)
        .map(|_| bf16::from_bits((value(50).to_bits() >> 16) as u16))
        .collect();
    let x: Vec<f32> = (0..rows * k).map(|_| value(20)).collect();
    let mut out = vec![0f32; rows * n];
    range(&pair_words(&x), k, &w, (0, n), Outputs::new(&mut out, n));
    (0..rows).all(|m| {
        (0..n).all(|c| {
            let want = column_scalar(&x[m * k..(m + 1) * k], &w, c, ColumnSum::Fused);
            out[m * n + c].to_bits() == want.to_bits()
        })
    })
}

/// Rows `x` `[rows, k]` (k even) as words of two bf16 values, step `2t`
/// in the high half of word `t`, `2t + 1` in the low one: what [`range`]
/// reads, made once per product.
pub(super) fn pair_words(x: &[f32]) -> Vec<u32> {
    let mut words = vec![0u32; x.len() / 2];
    for (t, word) in words.iter_mut().enumerate() {
        *word = (x[2 * t].to_bits() & 0xFFFF_0000) | (x[2 * t + 1].to_bits() >> 16);
    }
    words
}

/// `B` whole panels from panel `p0` of `R` rows (`rows`, each `half =
/// k / 2` words in `xp`): every lane sums its column in k order by pair
/// products, so the bits of [`column_scalar`]'s fused sum whatever the
/// block. Writes `16 B` outputs per row into those columns of `out`
/// (panel `p0`'s first on).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn strip<const R: usize, const B: usize>(
    xp: &[u32],
    half: usize,
    rows: [usize; R],
    w: &[bf16],
    p0: usize,
    out: Outputs,
) {
    use std::arch::x86_64::*;
    // Rows of the whole product's outputs; the strip's first column.
    let (out_cols, out_c0) = (out.stride, p0 * PANEL);
    let k = 2 * half;
    assert!((p0 + B) * k * PANEL <= w.len() && out_c0 + PANEL * B <= out_cols);
    assert!(rows.iter().all(|&r| (r + 1) * half <= xp.len()));
    // A panel's two steps 2t and 2t + 1 are 32 contiguous bf16 (16 columns
    // each); this permutation makes word j of the register column j's pair,
    // step 2t (element j) high and step 2t + 1 (element 16 + j) low.
    let order: [u16; 32] = std::array::from_fn(|h| {
        if h % 2 == 0 {
            16 + h as u16 / 2
        } else {
            h as u16 / 2
        }
    });
    let order = _mm512_loadu_si512(order.as_ptr() as *const __m512i);
    let mut acc = [[_mm512_setzero_ps(); B]; R];
    let from: [*const half::bf16; B] =
        std::array::from_fn(|b| w.as_ptr().add((p0 + b) * k * PANEL));
    let xs = rows.map(|r| xp.as_ptr().add(r * half));
    for t in 0..half {
        let ws: [__m512bh; B] = std::array::from_fn(|b| {
            _mm_prefetch::<_MM_HINT_T0>(from[b].wrapping_add((2 * t + AHEAD) * PANEL) as *const i8);
            let raw = _mm512_loadu_si512(from[b].add(2 * t * PANEL) as *const __m512i);
            std::mem::transmute::<__m512i, __m512bh>(_mm512_permutexvar_epi16(order, raw))
        });
        for r in 0..R {
            let xb = _mm512_set1_epi32(*xs[r].add(t) as i32);
            let xb = std::mem::transmute::<__m512i, __m512bh>(xb);
            for b in 0..B {
                acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xb, ws[b]);
            }
        }
    }
    for (row, sums) in rows.iter().zip(&acc) {
        assert!((row + 1) * out_cols <= out.len());
        for (b, sum) in sums.iter().enumerate() {
            _mm512_storeu_ps(
                out.as_mut_ptr().add(row * out_cols + out_c0 + PANEL * b),
                *sum,
            );
        }
    }
}

/// Steps of a panel's rows the kernel asks for ahead (4 KB of a stream).
const AHEAD: usize = 128;

/// Columns `[c0, c1)` (`c0` a multiple of [`PANEL`]) of every row of `xp`
/// (`[rows, k]` as [`pair_words`]; every value and weight [`in_pair_range`]) into
/// those columns of `out`: whole panels in blocks of eight rows by three
/// panels (24 sums in flight, each permuted weight register shared by
/// eight rows; the fastest block on a Zen 4 core, 112 G multiply-adds/s
/// against the fused kernels' 58), narrower ones for the rest and for a
/// decode step. Returns the first column left for the scalar tail.
pub(super) fn range(
    xp: &[u32],
    k: usize,
    w: &[bf16],
    (c0, c1): (usize, usize),
    out: Outputs,
) -> usize {
    assert!(k.is_multiple_of(2) && c0.is_multiple_of(PANEL));
    let half = k / 2;
    let rows = xp.len() / half;
    let (first, end) = (c0 / PANEL, c1 / PANEL);
    macro_rules! run {
        ($r:literal, $b:literal, $m:expr, $p:expr) => {{
            let block: [usize; $r] = std::array::from_fn(|i| $m + i);
            // SAFETY: the CPU has AVX-512F, BW and BF16 (`available`); the
            // kernel's asserts keep its loads inside `xp` and `w` and its
            // stores inside `out`.
            unsafe { strip::<$r, $b>(xp, half, block, w, $p, out) }
        }};
    }
    let mut p = first;
    while p < end {
        let panels = (end - p).min(if rows < 4 { 4 } else { 3 });
        let mut m = 0;
        macro_rules! rows_by {
            ($r:literal) => {{
                match panels {
                    4 => run!($r, 4, m, p),
                    3 => run!($r, 3, m, p),
                    2 => run!($r, 2, m, p),
                    _ => run!($r, 1, m, p),
                }
                m += $r;
            }};
        }
        while m + 8 <= rows {
            rows_by!(8);
        }
        while m + 4 <= rows {
            rows_by!(4);
        }
        while m < rows {
            rows_by!(1);
        }
        p += panels;
    }
    end * PANEL
}
