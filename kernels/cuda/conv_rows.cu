// conv_rows: the gated-delta layers' depthwise causal convolution over the T
// new positions of a decode step or a verified block, each output computed
// the same way whatever T is, and with no plan per shape (docs/gpu.md,
// "Row-invariant kernels": MLX's conv1d goes through cuDNN, which builds a
// plan the first time it meets a block length, some 300 ms on the H200).
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* x   [B, L, C]   the K - 1 cached inputs, then the T new ones (L = T + K - 1)
//   const <T>* w   [C, K, 1]   conv1d's weight with groups = C, as MLX lays it out
//   (plus x's shape, added by MLX because the body names it)
//   <T>* y         [B, T, C]
// Template ints: K (the kernel's width), DT (0 f32, 1 bf16, 2 f16). B, L and
// C are run-time.
//
// One thread per output (b, t, c): the sum over j = 0..K-1 of
// x[b, t + j, c] * w[c, j], in f32, j ascending, each product and sum
// rounded on its own (__fmul_rn / __fadd_rn, no FMA contraction), then
// rounded once to the output type. Nothing depends on T.

const int L = x_shape[1];
const int C = x_shape[2];
const int T = L - K + 1;
const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
if (T < 1 || idx >= (size_t)x_shape[0] * T * C) {
  return;
}
const int c = (int)(idx % C);
const size_t bt = idx / C;
const int t = (int)(bt % T);
const size_t b = bt / T;

auto load = [](const void* base, size_t at) -> float {
  if constexpr (DT == 0) {
    return reinterpret_cast<const float*>(base)[at];
  } else if constexpr (DT == 1) {
    return __uint_as_float(((unsigned int)reinterpret_cast<const unsigned short*>(base)[at]) << 16);
  } else {
    return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(base)[at]));
  }
};

float acc = 0.0f;
#pragma unroll
for (int j = 0; j < K; ++j) {
  const float xj = load(x, ((b * L) + t + j) * C + c);
  acc = __fadd_rn(acc, __fmul_rn(xj, load(w, (size_t)c * K + j)));
}
if constexpr (DT == 0) {
  reinterpret_cast<float*>(y)[idx] = acc;
} else if constexpr (DT == 1) {
  reinterpret_cast<unsigned short*>(y)[idx] = __bfloat16_as_ushort(__float2bfloat16_rn(acc));
} else {
  reinterpret_cast<unsigned short*>(y)[idx] = __half_as_ushort(__float2half_rn(acc));
}
