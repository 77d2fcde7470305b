//! [`sigmoid`] eight lanes at a time with AVX2 and FMA: MLX's exp
//! ([`mlx_exp`]) and the sigmoid's roundings written as vector operations
//! that each round as the scalar ones do, so every lane has the scalar
//! function's bits (`sigmoids_are_the_scalar_sigmoid`, over a stride of
//! every f32 and every bf16). The gates of a verify's 16 rows (SwiGLU's,
//! the gated norm's, attention's, the conv's silu) took a tenth of it one
//! value at a time.

use super::*;
use std::arch::x86_64::*;

/// [`round_bf16`] of eight lanes, a NaN made MLX's quiet NaN.
#[inline(always)]
unsafe fn round8(v: __m256) -> __m256 {
    let u = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    let r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    let r = _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(-65536)));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
    _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0_0000)), nan)
}

/// [`mlx_exp`] of eight lanes: the same products, the same f64 floor of
/// `y + 0.5`, the same fused polynomial, the same power of two; NaN kept,
/// infinity above 88 and 0 below -88.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let y = _mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2_E));
    let half = _mm256_set1_pd(0.5);
    let floor =
        |v: __m128| _mm256_cvtpd_ps(_mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(v), half)));
    let ipart = _mm256_set_m128(
        floor(_mm256_extractf128_ps::<1>(y)),
        floor(_mm256_castps256_ps128(y)),
    );
    let fpart = _mm256_sub_ps(y, ipart);
    let mut p = _mm256_set1_ps(EXP_POLYNOMIAL[0]);
    for c in &EXP_POLYNOMIAL[1..] {
        p = _mm256_fmadd_ps(p, fpart, _mm256_set1_ps(*c));
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvttps_epi32(ipart),
        _mm256_set1_epi32(127),
    ));
    let r = _mm256_mul_ps(_mm256_castsi256_ps(bits), p);
    let r = _mm256_blendv_ps(
        r,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(88.0)),
    );
    let r = _mm256_blendv_ps(
        r,
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-88.0)),
    );
    _mm256_blendv_ps(r, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// [`sigmoid`] of eight lanes.
#[inline(always)]
unsafe fn sigmoid8(x: __m256, round: bool) -> __m256 {
    let store = |v: __m256| if round { round8(v) } else { v };
    let one = _mm256_set1_ps(1.0);
    let magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    let y = _mm256_div_ps(one, _mm256_add_ps(one, store(exp8(magnitude))));
    let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
    store(_mm256_blendv_ps(_mm256_sub_ps(one, y), y, negative))
}

/// `out[i] = sigmoid(x[i], round)`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sigmoids(x: &[f32], round: bool, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    let whole = x.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), sigmoid8(v, round));
    }
    for i in whole..x.len() {
        out[i] = sigmoid(x[i], round);
    }
}
