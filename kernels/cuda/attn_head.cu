// attn_head: what a gated attention layer does between its q/k/v product and
// the attention itself, in one kernel: the queries' and keys' RMS norms, their
// partial RoPE, and the heads laid out as the attention kernel reads them
// (docs/gpu.md, "The attention's head in one kernel"). MLX's ops take six
// kernels for it (two norms, and for each RoPE of fewer dims than the head a
// copy and the rotation) and a graph node per reshape, split and transpose.
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* qg     [B, T, HQ * 2 D]  the query product: each head's D
//                     queries, then its D gate values (unread here); with
//                     GATED = 0 [B, T, HQ * D], the queries alone (an
//                     attention without an output gate: the drafter's)
//   const <T>* k, v   [B, T, HKV * D]   the key and value products
//   const <T>* qw, kw [D]               the q and k norms' weights
//   const int* offset [1]               the position of the first of the T tokens
//   const float* params [3]             log2 of RoPE's base, its scale, and
//                     the norm's epsilon
//   (plus qg's shape, added by MLX because the body names it)
//   <T>* q_out        [B, HQ, T, D]     queries normed, rotated
//   <T>* k_out, v_out [B, HKV, T, D]    keys normed, rotated; values as given
// Template ints: D (head dim, a multiple of 32 up to 1024), HQ, HKV, DIMS
// (the RoPE's dims, even, at most D: the first DIMS of a head rotate, pairs
// i and i + DIMS / 2), DT (1 bf16, 2 f16), GATED (1: qg holds each head's
// gate after its queries; 0: the queries alone). B and T are run-time.
//
// One block of D threads per (b, t, head), heads in the order queries, keys,
// values; thread d for dim d. Each row is computed alone, so row i of a
// T-row call is the 1-row call on row i, bit for bit. The steps round as
// MLX's ops round them:
// - the norm (MLX's `rms_norm`): n = rsqrt(sum of x^2 / D + eps), the sum in
//   f32 (lanes in a butterfly, then the warps in order: MLX sums in another
//   order, so n may differ from its in the last bit); y = x * n rounded to
//   T; then w * y rounded to T;
// - RoPE (MLX's `rope`, not traditional): for pair i, inv = 2^(-(i / (DIMS /
//   2)) * log2 base), theta = (scale * position) * inv; x1' = x1 cos - x2 sin,
//   x2' = x1 sin + x2 cos in f32 (each product rounded, no fused multiply-add),
//   rounded to T.

constexpr int HEADS = HQ + 2 * HKV;
constexpr int WARPS = D / 32;
constexpr int HALF = DIMS / 2;
const int T = qg_shape[1];
const size_t block = blockIdx.x;  // ((b * T) + t) * HEADS + head
const int head = (int)(block % HEADS);
const size_t bt = block / HEADS;
const int t = (int)(bt % T);
const size_t b = bt / T;
const int d = threadIdx.x;

auto to_float = [](unsigned short h) -> float {
  if constexpr (DT == 1) {
    return __uint_as_float(((unsigned int)h) << 16);
  } else {
    return __half2float(__ushort_as_half(h));
  }
};
auto to_bits = [](float v) -> unsigned short {
  if constexpr (DT == 1) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
};
auto round_to = [&](float v) -> float { return to_float(to_bits(v)); };

// Values: copied into the heads' layout, nothing else.
if (head >= HQ + HKV) {
  const int h = head - HQ - HKV;
  const unsigned short* src = reinterpret_cast<const unsigned short*>(v);
  unsigned short* dst = reinterpret_cast<unsigned short*>(v_out);
  dst[((b * HKV + h) * T + t) * D + d] = src[(bt * HKV + h) * D + d];
  return;
}

const bool is_query = head < HQ;
const int h = is_query ? head : head - HQ;
const unsigned short* row = is_query
    ? reinterpret_cast<const unsigned short*>(qg) + (bt * HQ + h) * (GATED ? 2 : 1) * D
    : reinterpret_cast<const unsigned short*>(k) + (bt * HKV + h) * D;
const unsigned short* weight =
    reinterpret_cast<const unsigned short*>(is_query ? qw : kw);
const float x = to_float(row[d]);

// The sum of squares: a butterfly in each warp, then the warps in order.
__shared__ float warp_sums[WARPS];
__shared__ float normed[D];
float sq = __fmul_rn(x, x);
#pragma unroll
for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
  sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, lane_mask));
}
if (d % 32 == 0) warp_sums[d / 32] = sq;
__syncthreads();
float total = 0.0f;
#pragma unroll
for (int w = 0; w < WARPS; ++w) total = __fadd_rn(total, warp_sums[w]);
const float n = rsqrtf(__fadd_rn(__fdiv_rn(total, (float)D), params[2]));
const float y = round_to(__fmul_rn(x, n));
const float value = round_to(__fmul_rn(to_float(weight[d]), y));
normed[d] = value;
__syncthreads();

float out = value;
if (d < DIMS) {
  const int i = d < HALF ? d : d - HALF;
  const float position = (float)(offset[0] + t);
  const float inv = exp2f(-((float)i / (float)HALF) * params[0]);
  const float theta = __fmul_rn(__fmul_rn(params[1], position), inv);
  const float c = cosf(theta);
  const float s = sinf(theta);
  const float x1 = normed[i];
  const float x2 = normed[i + HALF];
  out = d < HALF ? __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s))
                 : __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
}
unsigned short* dst = reinterpret_cast<unsigned short*>(is_query ? q_out : k_out);
const int heads = is_query ? HQ : HKV;
dst[((b * heads + h) * T + t) * D + d] = to_bits(out);
