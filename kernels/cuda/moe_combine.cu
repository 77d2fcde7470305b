// moe_combine: the end of a MoE block for a decode step or a verified block
// (docs/gpu.md, "The MoE block in kernels"): each token's experts'
// outputs weighted by their scores and summed, the shared expert's output
// times the sigmoid of its gate added, and the sum added onto the residual
// stream. Each output is computed alone, with each step rounded to the
// activations' type as MLX's ops round it (multiply, sum over the experts
// in f32, sigmoid, multiply, add, add), so a row's value is the same
// whatever the number of rows.
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* down     [T * KP, H] pair p = t * KP + j's expert output
//   const <T>* scores   [T, K]      moe_route.cu's weights
//   const <T>* shared   [T, H]      the shared expert's output (unread with SHARED = 1)
//   const <T>* gate     [T, S]      column GCOL: the shared expert's gate logit
//   const <T>* res      [T, H]      the residual stream (read with RES = 1)
//   (plus down's and gate's shapes, added by MLX because the body names them)
//   <T>* y              [T, H]
// Built with NORM_OUT defined (`row_invariant`'s COMBINE_NORM), also:
//   const <T>* nw       [H]         the next RMS norm's weight
//   const float* eps    [1]         its epsilon
//   <T>* normed         [T, H]      the RMS norm of y's row (the next layer's
//                                   input): y * rsqrt(mean(y^2) + eps) * nw
// Template ints: K (experts a token), GCOL, RES, HALF (0 bf16, 1 f16),
// SHARED: 1 where the shared expert ran among the experts (moe_route.cu's
// SHARED), so that KP = K + 1 and each token's last pair is its output.
// One thread an output; with NORM_OUT a block a token (docs/gpu.md, "The
// next norm in a MoE block's last kernel"), its threads taking the outputs
// blockDim.x apart, each summing the squares of its own in order, then the
// warps' sums by a butterfly and in warp order: the same for every number
// of tokens.

constexpr int KP = SHARED ? K + 1 : K;
const int H = down_shape[1];
const int T = down_shape[0] / KP;
const int S = gate_shape[1];

auto to_float = [](unsigned short bits) -> float {
  if constexpr (HALF) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(((unsigned int)bits) << 16);
  }
};
auto from_float = [](float v) -> unsigned short {
  if constexpr (HALF) {
    return __half_as_ushort(__float2half_rn(v));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
auto r = [&](float v) { return to_float(from_float(v)); };
const unsigned short* dn = reinterpret_cast<const unsigned short*>(down);
const unsigned short* sc = reinterpret_cast<const unsigned short*>(scores);
const unsigned short* sh = reinterpret_cast<const unsigned short*>(shared);
const unsigned short* gt = reinterpret_cast<const unsigned short*>(gate);
const unsigned short* rs = reinterpret_cast<const unsigned short*>(res);

// Output (t, h) (at idx = t H + h), rounded as it is stored.
auto output = [&](int t, int h, size_t idx) -> float {
  float routed = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const size_t pair = (size_t)t * KP + j;
    routed = __fadd_rn(routed, r(__fmul_rn(to_float(dn[pair * H + h]), to_float(sc[(size_t)t * K + j]))));
  }
  routed = r(routed);
  // sigmoid as MLX's op rounds it: 1 / (1 + e^|g|), mirrored for g >= 0.
  const float g = to_float(gt[(size_t)t * S + GCOL]);
  const float e = r(expf(fabsf(g)));
  const float s0 = r(__fdiv_rn(1.0f, r(__fadd_rn(1.0f, e))));
  const float sig = g < 0.0f ? s0 : r(__fsub_rn(1.0f, s0));
  const float own = to_float(SHARED ? dn[((size_t)t * KP + K) * H + h] : sh[idx]);
  float v = r(__fadd_rn(routed, r(__fmul_rn(own, sig))));
  if constexpr (RES) v = r(__fadd_rn(to_float(rs[idx]), v));
  return v;
};
unsigned short* ys = reinterpret_cast<unsigned short*>(y);
#ifndef NORM_OUT
{
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)T * H) return;
  ys[idx] = from_float(output((int)(idx / H), (int)(idx % H), idx));
}
#else
{
  const int t = blockIdx.x;
  if (t >= T) return;
  float squares = 0.0f;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    const float v = output(t, h, (size_t)t * H + h);
    ys[(size_t)t * H + h] = from_float(v);
    squares = __fmaf_rn(v, v, squares);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) squares = __fadd_rn(squares, __shfl_xor_sync(0xFFFFFFFFu, squares, o));
  __shared__ float warp_squares[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_squares[warp] = squares;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total = __fadd_rn(total, warp_squares[w]);
  const float scale = rsqrtf(__fadd_rn(__fdiv_rn(total, (float)H), eps[0]));
  const unsigned short* ws = reinterpret_cast<const unsigned short*>(nw);
  unsigned short* ns = reinterpret_cast<unsigned short*>(normed);
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    const float v = to_float(ys[(size_t)t * H + h]);
    ns[(size_t)t * H + h] = from_float(__fmul_rn(to_float(ws[h]), __fmul_rn(v, scale)));
  }
}
#endif
