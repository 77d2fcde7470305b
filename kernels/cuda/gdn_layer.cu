// gdn_layer: the middle of a gated-delta layer in one launch, from its input
// projections' outputs to the gated norm's output (the input of out_proj),
// for the T new tokens of a decode step, a verified block or a prefill
// (docs/gpu.md, "One kernel per gated-delta layer"). It replaces some thirty
// MLX ops a layer: the conv-state concatenation, the depthwise conv, SiLU,
// the split, the q/k norms and scales, the gating math, the recurrence with
// its tape, and the gated RMSNorm.
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <DT>* qkv        [B, T, C]  C = 2*HK*DK + HV*DV (in_proj_qkv's output)
//   const <DT>* z          [B, T, HV*DV]
//   const <DT>* b_in, a_in [B, T, HV]
//   const <DT>* conv_state [B, K-1, C]
//   const float* conv_w    [C, K]     conv1d's depthwise weight
//   const float* a_log, dt_bias [HV]; norm_w [DV]
//   const float* consts    [4]        q/k norm eps, gated norm eps, q scale, k scale
//   const float* state     [B, HV, DV, DK]
//   (plus qkv's shape, added by MLX because the body names it)
//   <DT>* out              [B, T, HV*DV]  the gated norm's output
//   float* state_out       [B, HV, DV, DK]
//   <DT>* conv_out         [B, K-1, C]    the new conv state
//   float* k_tape          [B, T, HK, DK] normalized keys (for a rollback)
//   float* g_tape          [B, T, HV]     decays
//   float* delta           [B, T, HV, DV] per-step updates
// Template ints: HK, HV, DK, DV, K, NT (threads a block: DV rounded up to a
// warp), DT (the activations: 0 f32, 1 bf16, 2 f16), RA (the type a + dt_bias
// is rounded to: its promotion), RN (the gated norm's output type).
//
// One block per (b, value head), NT threads; thread dv < DV owns state row
// dv (its DK values in registers). Per step t, in the order of the MLX ops
// path (flashbar-models `nn::gated_delta`), each value rounded to the type
// the op it replaces returns:
//   conv over the K rows ending at t, SiLU = x * sigmoid(x)    (DT)
//   q, k: RMS-normalized per head, then scaled                  (DT)
//   beta = sigmoid(b);  g = exp(-exp(A_log) * softplus(a + dt_bias))
//   s = s * g;  kv = <s, k>;  delta = (v - kv) * beta;  s = s + k * delta;
//   y = <s, q>  (as gdn_record.cu: the state updates never contracted into
//   an FMA, so gdn_replay.cu replays them bit for bit)
//   out = silu(z) * rms_norm(y) * norm_w
// The block sums (norms) add in a fixed order. Nothing a step computes
// depends on T, so a verified block equals its decode steps bit for bit.

const int T = qkv_shape[1];
constexpr int C = 2 * HK * DK + HV * DV;
constexpr int WARPS = NT / 32;
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;
const int hv = blockIdx.x % HV;
const size_t b = blockIdx.x / HV;
const int hk = hv / (HV / HK);
const bool first_of_key = hv % (HV / HK) == 0;
const bool owns_row = tid < DV;
const int dv = tid;

auto load = [](const void* base, size_t at) -> float {
  if constexpr (DT == 0) {
    return reinterpret_cast<const float*>(base)[at];
  } else if constexpr (DT == 1) {
    return __uint_as_float(((unsigned int)reinterpret_cast<const unsigned short*>(base)[at]) << 16);
  } else {
    return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(base)[at]));
  }
};
auto store = [](void* base, size_t at, float value) {
  if constexpr (DT == 0) {
    reinterpret_cast<float*>(base)[at] = value;
  } else if constexpr (DT == 1) {
    reinterpret_cast<unsigned short*>(base)[at] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  } else {
    reinterpret_cast<unsigned short*>(base)[at] = __half_as_ushort(__float2half_rn(value));
  }
};
auto round_to = [](float x, int type) -> float {
  if (type == 1) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
  if (type == 2) {
    return __half2float(__float2half_rn(x));
  }
  return x;
};
auto sigmoid = [](float x) -> float { return 1.0f / (1.0f + expf(-x)); };

// Row r of [conv_state; qkv] (r < K-1 + T), channel ch.
auto conv_input = [&](int r, int ch) -> float {
  return r < K - 1 ? load(conv_state, (b * (K - 1) + r) * C + ch)
                   : load(qkv, (b * T + (r - (K - 1))) * C + ch);
};
// The conv output at step t, channel ch, through SiLU, as the ops round it.
auto conv_silu = [&](int t, int ch) -> float {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    acc = __fadd_rn(acc, __fmul_rn(conv_input(t + j, ch), conv_w[ch * K + j]));
  }
  const float x = round_to(acc, DT);
  return round_to(__fmul_rn(x, round_to(sigmoid(x), DT)), DT);
};

__shared__ float qk[2 * DK];  // this step's normalized q, then k
__shared__ float partial[2][WARPS];
__shared__ float total[2];
// Two sums over the block's threads, in a fixed order (lanes, then warps in
// order), left in total[0], total[1]. Every thread must call it.
auto block_sum = [&](float x0, float x1) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x0 = __fadd_rn(x0, __shfl_xor_sync(0xffffffffu, x0, offset));
    x1 = __fadd_rn(x1, __shfl_xor_sync(0xffffffffu, x1, offset));
  }
  if (lane == 0) {
    partial[0][warp] = x0;
    partial[1][warp] = x1;
  }
  __syncthreads();
  if (tid == 0) {
    float s0 = 0.0f, s1 = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      s0 = __fadd_rn(s0, partial[0][w]);
      s1 = __fadd_rn(s1, partial[1][w]);
    }
    total[0] = s0;
    total[1] = s1;
  }
  __syncthreads();
};

const float eps_qk = consts[0];
const float eps_norm = consts[1];
const float q_scale = round_to(consts[2], DT);
const float k_scale = round_to(consts[3], DT);
const float decay = expf(a_log[hv]);

float s[DK];
#pragma unroll
for (int j = 0; j < DK; ++j) {
  s[j] = owns_row ? state[((b * HV + hv) * DV + dv) * DK + j] : 0.0f;
}

for (int t = 0; t < T; ++t) {
  const size_t bt = b * T + t;

  // q and k of key head hk: conv, SiLU, RMS norm, scale.
  float sq = 0.0f, sk = 0.0f;
  for (int c = tid; c < DK; c += NT) {
    const float qv = conv_silu(t, hk * DK + c);
    const float kv = conv_silu(t, HK * DK + hk * DK + c);
    qk[c] = qv;
    qk[DK + c] = kv;
    sq = __fadd_rn(sq, __fmul_rn(qv, qv));
    sk = __fadd_rn(sk, __fmul_rn(kv, kv));
  }
  block_sum(sq, sk);
  const float rq = rsqrtf(total[0] / DK + eps_qk);
  const float rk = rsqrtf(total[1] / DK + eps_qk);
  for (int c = tid; c < DK; c += NT) {
    qk[c] = round_to(round_to(qk[c] * rq, DT) * q_scale, DT);
    qk[DK + c] = round_to(round_to(qk[DK + c] * rk, DT) * k_scale, DT);
    if (first_of_key) {
      k_tape[(bt * HK + hk) * DK + c] = qk[DK + c];
    }
  }
  __syncthreads();

  // Gating: the same values in every thread.
  const size_t head = bt * HV + hv;
  const float beta = round_to(sigmoid(load(b_in, head)), DT);
  const float ab = round_to(load(a_in, head) + dt_bias[hv], RA);
  const float softplus = round_to(fmaxf(ab, 0.0f) + log1pf(expf(-fabsf(ab))), RA);
  const float g = expf(-(decay * softplus));
  if (tid == 0) {
    g_tape[head] = g;
  }

  float y = 0.0f;
  if (owns_row) {
    const float v = conv_silu(t, 2 * HK * DK + hv * DV + dv);
    float kv = 0.0f;
#pragma unroll
    for (int j = 0; j < DK; ++j) {
      s[j] = __fmul_rn(s[j], g);
      kv = fmaf(s[j], qk[DK + j], kv);
    }
    const float d = __fmul_rn(__fsub_rn(v, kv), beta);
    delta[head * DV + dv] = d;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < DK; ++j) {
      s[j] = __fadd_rn(s[j], __fmul_rn(qk[DK + j], d));
      acc = fmaf(s[j], qk[j], acc);
    }
    y = round_to(acc, DT);
  }

  // Gated RMSNorm over the head's DV outputs.
  block_sum(__fmul_rn(y, y), 0.0f);
  if (owns_row) {
    const float r = rsqrtf(total[0] / DV + eps_norm);
    const float normed = round_to(norm_w[dv] * (y * r), RN);
    const float zf = load(z, head * DV + dv);
    const float gate = __fmul_rn(zf, sigmoid(zf));
    store(out, head * DV + dv, __fmul_rn(gate, normed));
  }
}

if (owns_row) {
#pragma unroll
  for (int j = 0; j < DK; ++j) {
    state_out[((b * HV + hv) * DV + dv) * DK + j] = s[j];
  }
}
// The new conv state: rows T .. T+K-2 of [conv_state; qkv]. The key head's
// q/k channels are written by the first of its value heads.
for (int r = 0; r < K - 1; ++r) {
  if (first_of_key) {
    for (int c = tid; c < DK; c += NT) {
      store(conv_out, (b * (K - 1) + r) * C + hk * DK + c, conv_input(T + r, hk * DK + c));
      store(conv_out, (b * (K - 1) + r) * C + HK * DK + hk * DK + c,
            conv_input(T + r, HK * DK + hk * DK + c));
    }
  }
  if (owns_row) {
    const int ch = 2 * HK * DK + hv * DV + dv;
    store(conv_out, (b * (K - 1) + r) * C + ch, conv_input(T + r, ch));
  }
}
