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
// Template ints: K (experts a token), GCOL, RES, HALF (0 bf16, 1 f16),
// SHARED: 1 where the shared expert ran among the experts (moe_route.cu's
// SHARED), so that KP = K + 1 and each token's last pair is its output.
// One thread an output.

constexpr int KP = SHARED ? K + 1 : K;
const int H = down_shape[1];
const int T = down_shape[0] / KP;
const int S = gate_shape[1];
const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
if (idx >= (size_t)T * H) return;
const int t = (int)(idx / H);
const int h = (int)(idx % H);

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
reinterpret_cast<unsigned short*>(y)[idx] = from_float(v);
