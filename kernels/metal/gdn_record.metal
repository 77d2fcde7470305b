// gdn_record: the gated-delta recurrence over T steps, recording the rollback tape.
// The Metal twin of kernels/cuda/gdn_record.cu; read that file first.
//
// A kernel BODY for MLX's fast::metal_kernel, which generates the signature
// from the names, in order: inputs q, k [B,T,HK,DK], v [B,T,HV,DV],
// g, beta [B,T,HV], state [B,HV,DV,DK] (plus q's shape, because the body
// refers to it); outputs y [B,T,HV,DV], state_out [B,HV,DV,DK],
// delta [B,T,HV,DV]. HK, HV, DK, DV are int template parameters. All float32,
// row-contiguous. One thread per state row (b, hv, dv), B*HV*DV threads.
//
// Per step:  s = s * g_t;  kv = <s, k_t>;  delta = (v_t - kv) * beta_t;
//            s = s + k_t * delta (one explicit fma);  y_t = <s, q_t>
// The state updates are written exactly as in gdn_replay.metal (a plain
// multiply, then an explicit metal::fma, so no contraction choice is left to
// the compiler), so that replaying the tape reproduces this kernel's state
// bit for bit. (CUDA rounds the product separately instead; each backend only
// has to agree with itself.)

const int batch = q_shape[0];
const int length = q_shape[1];
const int row = int(thread_position_in_grid.x);
if (row >= batch * HV * DV) {
  return;
}
const int dv = row % DV;
const int hv = (row / DV) % HV;
const int b = row / (DV * HV);
const int hk = hv / (HV / HK);

float s[DK];
for (int j = 0; j < DK; ++j) {
  s[j] = state[row * DK + j];
}

for (int t = 0; t < length; ++t) {
  const int bt = b * length + t;
  const int key = (bt * HK + hk) * DK;  // q_t, k_t start here
  const int head = bt * HV + hv;        // g_t, beta_t
  const int out = head * DV + dv;       // v_t, y_t, delta_t
  const float g_t = g[head];

  float kv = 0.0f;
  for (int j = 0; j < DK; ++j) {
    s[j] = s[j] * g_t;
    kv = metal::fma(s[j], k[key + j], kv);
  }
  const float d = (v[out] - kv) * beta[head];
  delta[out] = d;

  float acc = 0.0f;
  for (int j = 0; j < DK; ++j) {
    s[j] = metal::fma(k[key + j], d, s[j]);
    acc = metal::fma(s[j], q[key + j], acc);
  }
  y[out] = acc;
}

for (int j = 0; j < DK; ++j) {
  state_out[row * DK + j] = s[j];
}
