// gdn_replay: re-advance a saved GDN state through the first n steps of a
// recorded tape. The Metal twin of kernels/cuda/gdn_replay.cu; read that first.
//
// A kernel BODY for MLX's fast::metal_kernel: inputs state0 [B,HV,DV,DK],
// k [B,T,HK,DK] (plus k's shape, because the body refers to it), g [B,T,HV],
// delta [B,T,HV,DV], n_steps [1] int32 (n, clamped to 0..=T); output
// state_out [B,HV,DV,DK]. HK, HV, DK, DV are int template parameters.
// One thread per state row (b, hv, dv), B*HV*DV threads.
//
// Per step t < n:  s = s * g_t;  s = metal::fma(k_t, delta_t, s)  -- written
// exactly as in gdn_record.metal, so the result equals the state gdn_record
// reaches after the same n steps, bit for bit.

const int batch = k_shape[0];
const int length = k_shape[1];
const int row = int(thread_position_in_grid.x);
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
for (int j = 0; j < DK; ++j) {
  s[j] = state0[row * DK + j];
}

for (int t = 0; t < count; ++t) {
  const int bt = b * length + t;
  const int key = (bt * HK + hk) * DK;  // k_t starts here
  const int head = bt * HV + hv;        // g_t
  const float g_t = g[head];
  const float d = delta[head * DV + dv];
  for (int j = 0; j < DK; ++j) {
    s[j] = s[j] * g_t;
    s[j] = metal::fma(k[key + j], d, s[j]);
  }
}

for (int j = 0; j < DK; ++j) {
  state_out[row * DK + j] = s[j];
}
