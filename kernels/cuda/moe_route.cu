// moe_route: a MoE router's choice for each token of a decode step or a
// verified block (docs/gpu.md, "The MoE block in kernels"): the
// softmax over the experts' logits, the top K, their scores (divided by
// their sum with NORM), and the (row, expert) pairs the experts' gathered
// products read (qmm.cu with GATHER).
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* logits     [T, S]  the router's product, bf16 (HALF = 0) or
//                                 f16 (HALF = 1); columns 0 .. E-1 are the
//                                 experts' logits (S > E where a stacked
//                                 product's other maps follow them)
//   (plus logits' shape, added by MLX because the body names it)
//   int32_t* pairs_in     [2, T * KP]  pair p = t * KP + j: (t, its j-th expert),
//                                      for the experts' gate/up product of row t
//   int32_t* pairs_out    [2, T * KP]  (p, the same expert), for the down product
//                                      of pair p's own row
//   <T>* scores           [T, K]       the j-th expert's weight
// Template ints: E (experts, a multiple of 32, at most 1024), K (experts a
// token, 1 .. 32), NORM, HALF, SHARED. T and S are run-time. KP = K, or with
// SHARED = 1 (K < 32) K + 1: each token's last pair is then (t, E), the
// shared expert stacked after the routed ones as expert E (docs/gpu.md,
// "The shared expert among the experts"); it has no score.
//
// One warp a token; lane l holds the logits of experts l, l + 32, ... The
// softmax is taken in f32 as MLX's precise softmax takes it (the largest
// logit subtracted, the sum of the exponentials divided into each) and
// rounded to the activations' type, as the product the ops path ranks; the
// top K are chosen one at a time, the largest probability first and the
// lower expert first among equals. The sums over lanes go by a butterfly
// in a fixed order: a token's choice is the same whatever T is, so a
// verified block routes each token as a decode step does.

constexpr int PER = E / 32;
const int T = logits_shape[0];
const int S = logits_shape[1];
const int lane = threadIdx.x & 31;
const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
if (t >= T) return;

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
auto rounded = [&](float v) { return to_float(from_float(v)); };

const unsigned short* row = reinterpret_cast<const unsigned short*>(logits) + (size_t)t * S;
float p[PER];
float top = __int_as_float(0xff800000);  // -inf
#pragma unroll
for (int i = 0; i < PER; ++i) {
  p[i] = to_float(row[i * 32 + lane]);
  top = fmaxf(top, p[i]);
}
#pragma unroll
for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, o));
float sum = 0.0f;
#pragma unroll
for (int i = 0; i < PER; ++i) {
  p[i] = expf(__fsub_rn(p[i], top));
  sum = __fadd_rn(sum, p[i]);
}
#pragma unroll
for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, o));
#pragma unroll
for (int i = 0; i < PER; ++i) p[i] = rounded(__fdiv_rn(p[i], sum));

// The top K, one at a time: each lane offers its best expert not yet taken,
// the warp keeps the largest (the lower expert among equals).
unsigned int taken = 0u;
int chosen[K];
float weight[K];
#pragma unroll
for (int j = 0; j < K; ++j) {
  float best = -1.0f;
  int at = 0x7FFFFFFF;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    if (!((taken >> i) & 1u) && p[i] > best) {
      best = p[i];
      at = i * 32 + lane;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, best, o);
    const int other_at = __shfl_xor_sync(0xFFFFFFFFu, at, o);
    if (other > best || (other == best && other_at < at)) {
      best = other;
      at = other_at;
    }
  }
  if (at < E && (at & 31) == lane) taken |= 1u << (at >> 5);
  chosen[j] = at;
  weight[j] = best;
}

float divisor = 1.0f;
if constexpr (NORM) {
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) total = __fadd_rn(total, weight[j]);
  divisor = rounded(total);
}
int* in = reinterpret_cast<int*>(pairs_in);
int* out = reinterpret_cast<int*>(pairs_out);
unsigned short* sc = reinterpret_cast<unsigned short*>(scores);
constexpr int KP = SHARED ? K + 1 : K;
const int P = T * KP;
#pragma unroll
for (int j = 0; j < KP; ++j) {
  if (lane == j) {
    const int pair = t * KP + j;
    const int expert = j < K ? chosen[j] : E;
    in[pair] = t;
    in[P + pair] = expert;
    out[pair] = pair;
    out[P + pair] = expert;
    if (j < K) sc[t * K + j] = from_float(NORM ? __fdiv_rn(weight[j], divisor) : weight[j]);
  }
}
