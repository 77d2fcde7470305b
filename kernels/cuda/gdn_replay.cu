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
// the state gdn_record reaches after the same n steps, bit for bit. A row and
// k_t are read (and the row written) as float4 where DK is a multiple of 4
// and the arrays are 16-byte aligned, as gdn_layer.cu reads its state rows
// (docs/gpu.md, "The gated-delta layer's state, loaded by rows"): the same
// values, a quarter of the accesses.

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

auto aligned = [](const void* base) -> bool {
  return DK % 4 == 0 && (reinterpret_cast<size_t>(base) & 15) == 0;
};
const bool vec_k = aligned(k);
float s[DK];
if (aligned(state0)) {
#pragma unroll
  for (int j = 0; j + 3 < DK; j += 4) {
    const float4 v = *reinterpret_cast<const float4*>(state0 + (size_t)row * DK + j);
    s[j] = v.x;
    s[j + 1] = v.y;
    s[j + 2] = v.z;
    s[j + 3] = v.w;
  }
} else {
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    s[j] = state0[(size_t)row * DK + j];
  }
}

for (int t = 0; t < count; ++t) {
  const size_t bt = (size_t)b * length + t;
  const size_t key = (bt * HK + hk) * DK;  // k_t starts here
  const size_t head = bt * HV + hv;        // g_t
  const float g_t = g[head];
  const float d = delta[head * DV + dv];
  if (vec_k) {
#pragma unroll
    for (int j = 0; j + 3 < DK; j += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(k + key + j);
      const float kj[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j + e] = __fmul_rn(s[j + e], g_t);
        s[j + e] = __fadd_rn(s[j + e], __fmul_rn(kj[e], d));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < DK; ++j) {
      s[j] = __fmul_rn(s[j], g_t);
      s[j] = __fadd_rn(s[j], __fmul_rn(k[key + j], d));
    }
  }
}

if (aligned(state_out)) {
#pragma unroll
  for (int j = 0; j + 3 < DK; j += 4) {
    *reinterpret_cast<float4*>(state_out + (size_t)row * DK + j) =
        make_float4(s[j], s[j + 1], s[j + 2], s[j + 3]);
  }
} else {
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    state_out[(size_t)row * DK + j] = s[j];
  }
}
