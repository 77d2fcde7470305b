// gdn_replay: re-advance a saved GDN state through the first n steps of a
// recorded tape (rollback after a partial accept).
//
// A kernel BODY for MLX's fast::cuda_kernel, which JIT-compiles it with NVRTC
// inside a generated `__global__` function whose parameters are, in order:
//   const float* state0    [B, HV, DV, DK]   the state before the recorded steps
//   const float* k         [B, T, HK, DK]
//   (plus k's shape, added by MLX because the body refers to it)
//   const float* g         [B, T, HV]
//   const float* delta     [B, T, HV, DV]    the tape gdn_record wrote
//   const int32_t* n_steps [1]               n, clamped to 0..=T
//   float* state_out       [B, HV, DV, DK]
// HK, HV, DK, DV are template ints (constexpr in the body); B and T are read
// from k's shape at run time. Everything but n_steps is float32, row-contiguous.
//
// One thread per state row (b, hv, dv), over a grid of B*HV*DV threads. Per
// step t < n:  s = s * g_t;  s = s + k_t * delta_t.  Written with
// __fmul_rn / __fadd_rn exactly as in gdn_record.cu, so that the result equals
// the state gdn_record reaches after the same n steps, bit for bit.

const int batch = k_shape[0];
const int length = k_shape[1];
const int row = blockIdx.x * blockDim.x + threadIdx.x;
if (row >= batch * HV * DV) {
  return;
}
const int requested = n_steps[0];
const int count = requested < 0 ? 0 : (requested > length ? length : requested);
const int dv = row % DV;
const int hv = (row / DV) % HV;
const int b = row / (DV * HV);
const int hk = hv / (HV / HK);

float s[DK];
#pragma unroll
for (int j = 0; j < DK; ++j) {
  s[j] = state0[(size_t)row * DK + j];
}

for (int t = 0; t < count; ++t) {
  const size_t bt = (size_t)b * length + t;
  const size_t key = (bt * HK + hk) * DK;  // k_t starts here
  const size_t head = bt * HV + hv;        // g_t
  const float g_t = g[head];
  const float d = delta[head * DV + dv];
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    s[j] = __fmul_rn(s[j], g_t);
    s[j] = __fadd_rn(s[j], __fmul_rn(k[key + j], d));
  }
}

#pragma unroll
for (int j = 0; j < DK; ++j) {
  state_out[(size_t)row * DK + j] = s[j];
}
