// gdn_record: the gated-delta recurrence over T steps, recording the rollback tape.
//
// A kernel BODY for MLX's fast::cuda_kernel, which JIT-compiles it with NVRTC
// inside a generated `__global__` function whose parameters are, in order:
//   const float* q, k      [B, T, HK, DK]
//   const float* v         [B, T, HV, DV]
//   const float* g, beta   [B, T, HV]
//   const float* state     [B, HV, DV, DK]
//   (plus q's shape, added by MLX because the body refers to it)
//   float* y               [B, T, HV, DV]
//   float* state_out       [B, HV, DV, DK]
//   float* delta           [B, T, HV, DV]   the tape
// HK, HV, DK, DV are template ints (constexpr in the body); B and T are read
// from q's shape at run time. Everything is float32 and row-contiguous.
//
// One thread per state row (b, hv, dv), over a grid of B*HV*DV threads; the
// row's DK values stay in registers while the thread walks the T steps. Value
// head hv reads key head hv / (HV / HK). Per step, in the order of the MLX ops
// path (flashbar-models `gated_delta::recurrence`):
//   s = s * g_t;  kv = <s, k_t>;  delta = (v_t - kv) * beta_t;
//   s = s + k_t * delta;  y_t = <s, q_t>
// The two state updates are written with __fmul_rn / __fadd_rn (never
// contracted into an FMA) exactly as in gdn_replay.cu, so that replaying the
// tape reproduces this kernel's state bit for bit. Keep the two files in step.

const int batch = q_shape[0];
const int length = q_shape[1];
const int row = blockIdx.x * blockDim.x + threadIdx.x;
if (row >= batch * HV * DV) {
  return;
}
const int dv = row % DV;
const int hv = (row / DV) % HV;
const int b = row / (DV * HV);
const int hk = hv / (HV / HK);

float s[DK];
#pragma unroll
for (int j = 0; j < DK; ++j) {
  s[j] = state[(size_t)row * DK + j];
}

for (int t = 0; t < length; ++t) {
  const size_t bt = (size_t)b * length + t;
  const size_t key = (bt * HK + hk) * DK;  // q_t, k_t start here
  const size_t head = bt * HV + hv;        // g_t, beta_t
  const size_t out = head * DV + dv;       // v_t, y_t, delta_t
  const float g_t = g[head];

  float kv = 0.0f;
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    s[j] = __fmul_rn(s[j], g_t);
    kv = fmaf(s[j], k[key + j], kv);
  }
  const float d = __fmul_rn(__fsub_rn(v[out], kv), beta[head]);
  delta[out] = d;

  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    s[j] = __fadd_rn(s[j], __fmul_rn(k[key + j], d));
    acc = fmaf(s[j], q[key + j], acc);
  }
  y[out] = acc;
}

#pragma unroll
for (int j = 0; j < DK; ++j) {
  state_out[(size_t)row * DK + j] = s[j];
}
