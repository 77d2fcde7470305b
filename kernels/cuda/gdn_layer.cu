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
// Template ints: HK, HV, DK, DV, K, SPLIT (threads a state row: 1, or 4 where
// DK is a multiple of 16), NT (threads a block: SPLIT * DV rounded up to a
// warp), DT (the activations: 0 f32, 1 bf16, 2 f16), RA (the type a + dt_bias
// is rounded to: its promotion), RN (the gated norm's output type).
//
// One block per (b, value head), NT threads; the SPLIT threads SPLIT dv ..
// SPLIT dv + SPLIT - 1 own state row dv < DV, in registers: with SPLIT = 1
// the whole row, else part p the float4 columns 4 p, 4 p + 4 SPLIT, ...
// (docs/gpu.md, "A state row over four threads"). Per step t, in the order of the MLX ops
// path (flashbar-models `nn::gated_delta`), each value rounded to the type
// the op it replaces returns:
//   conv over the K rows ending at t, SiLU = x * sigmoid(x)    (DT)
//   q, k: RMS-normalized per head, then scaled                  (DT)
//   beta = sigmoid(b);  g = exp(-exp(A_log) * softplus(a + dt_bias))
//   s = s * g;  kv = <s, k>;  delta = (v - kv) * beta;  s = s + k * delta;
//   y = <s, q>  (as gdn_record.cu: the state updates never contracted into
//   an FMA, so gdn_replay.cu replays them bit for bit; a dot product is each
//   part's FMA chain over its columns in order, then with SPLIT > 1 the
//   parts' sums over a butterfly of the row's threads)
//   out = silu(z) * rms_norm(y) * norm_w
//
// The schedule (docs/gpu.md, "One kernel per gated-delta layer"): a step
// done alone would wait on its own global loads (the conv inputs, b, a, z)
// and on five block-wide barriers; here the steps go in tiles of TT:
// - A1, every thread on the tile's conv + SiLU values of q, k and v (each
//   its own channels of each step), beta and g, into shared memory; A2, a
//   warp a step (warp w takes steps w, w + WARPS, ...): the q/k norms;
// - B, the recurrence, step after step, each thread on its own state row
//   (no barrier inside: what a step reads was written in A);
// - C1, a warp a step: the gated RMSNorm's sum; C2, every thread on the
//   tile's outputs.
// The state's rows are read and written as float4 where the arrays allow
// (docs/gpu.md, "The gated-delta layer's state, loaded by rows").
// Each value is computed by the same operations in the same order as when
// the steps ran one by one (this schedule's outputs equal that one's bit
// for bit; docs/gpu.md). The two block sums (the q/k norms' and the gated
// norm's) have a fixed order: thread tau (of RT, DV rounded up to a warp,
// whatever SPLIT is) would add its channels
// tau, tau + RT, ... in order, each warp of threads sum over a butterfly,
// and the warps' sums be added in warp order; one warp plays each of those
// warps of threads in turn (lane l as thread 32 g + l), the same
// butterflies, then the same in-order sum. Nothing depends on T or on the
// tile a step falls in, so a verified block equals its decode steps bit
// for bit.

const int T = qkv_shape[1];
constexpr int C = 2 * HK * DK + HV * DV;
constexpr int WARPS = NT / 32;
constexpr int RT = (DV + 31) / 32 * 32;  // the block sums' threads (above)
constexpr int RWARPS = RT / 32;
constexpr int SL = DK / SPLIT;  // state values a thread
static_assert(SPLIT == 1 || (DK % (4 * SPLIT) == 0 && 32 % SPLIT == 0), "SPLIT");
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;
const int hv = blockIdx.x % HV;
const size_t b = blockIdx.x / HV;
const int hk = hv / (HV / HK);
const bool first_of_key = hv % (HV / HK) == 0;
const int dv = tid / SPLIT;    // the state row this thread has a part of
const int part = tid % SPLIT;
const bool owns_row = dv < DV;
// The row's column of this thread's l-th state value.
auto column = [&](int l) -> int { return (l / 4) * (4 * SPLIT) + 4 * part + l % 4; };
// A dot product's parts, summed over the row's threads (every lane runs it).
auto across = [](float x) -> float {
#pragma unroll
  for (int offset = 1; offset < SPLIT; offset <<= 1) {
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
};

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

constexpr int TT = 8;  // steps a tile

__shared__ float qk[TT][2 * DK];  // normalized q, then k, of each step of the tile
__shared__ float vs[TT][DV];      // conv + SiLU of v
__shared__ float ys[TT][DV];      // the recurrence's outputs, rounded
__shared__ float betas[TT];
__shared__ float gs[TT];
__shared__ float norms[TT];       // the gated norm's factor of each step

// The butterfly of gdn_layer.cu's block sums, over one warp's lanes.
auto butterfly = [](float x) -> float {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
};

const float eps_qk = consts[0];
const float eps_norm = consts[1];
const float q_scale = round_to(consts[2], DT);
const float k_scale = round_to(consts[3], DT);
const float decay = expf(a_log[hv]);

// 16-byte accesses to a row where DK allows and the array is aligned so.
auto by_float4 = [](const void* base) -> bool {
  return DK % 4 == 0 && (reinterpret_cast<size_t>(base) & 15) == 0;
};
const size_t row_at = ((b * HV + hv) * DV + dv) * DK;
float s[SL];
if (owns_row && by_float4(state)) {
#pragma unroll
  for (int l = 0; l + 3 < SL; l += 4) {
    const float4 v = *reinterpret_cast<const float4*>(state + row_at + column(l));
    s[l] = v.x;
    s[l + 1] = v.y;
    s[l + 2] = v.z;
    s[l + 3] = v.w;
  }
} else {
#pragma unroll
  for (int l = 0; l < SL; ++l) {
    s[l] = owns_row ? state[row_at + column(l)] : 0.0f;
  }
}

for (int t0 = 0; t0 < T; t0 += TT) {
  const int steps = min(TT, T - t0);

  // A1: conv + SiLU of the head's q, k and v channels at each step of the
  // tile, every thread on its own (step, channel) pairs; beta and g.
  constexpr int PER_STEP = 2 * DK + DV;
  for (int e = tid; e < steps * PER_STEP; e += NT) {
    const int i = e / PER_STEP;
    const int x = e % PER_STEP;
    if (x < DK) {
      qk[i][x] = conv_silu(t0 + i, hk * DK + x);
    } else if (x < 2 * DK) {
      qk[i][x] = conv_silu(t0 + i, HK * DK + hk * DK + (x - DK));
    } else {
      vs[i][x - 2 * DK] = conv_silu(t0 + i, 2 * HK * DK + hv * DV + (x - 2 * DK));
    }
  }
  if (tid < steps) {
    const size_t head = (b * T + t0 + tid) * HV + hv;
    betas[tid] = round_to(sigmoid(load(b_in, head)), DT);
    const float ab = round_to(load(a_in, head) + dt_bias[hv], RA);
    const float softplus = round_to(fmaxf(ab, 0.0f) + log1pf(expf(-fabsf(ab))), RA);
    const float g = expf(-(decay * softplus));
    gs[tid] = g;
    g_tape[head] = g;
  }
  __syncthreads();

  // A2: the q/k norms, a warp a step.
  for (int i = warp; i < steps; i += WARPS) {
    const size_t bt = b * T + t0 + i;
    float tq = 0.0f, tk = 0.0f;
    for (int group = 0; group < RWARPS; ++group) {
      const int tau = 32 * group + lane;
      float sq = 0.0f, sk = 0.0f;
      for (int c = tau; c < DK; c += RT) {
        const float qv = qk[i][c];
        const float kv = qk[i][DK + c];
        sq = __fadd_rn(sq, __fmul_rn(qv, qv));
        sk = __fadd_rn(sk, __fmul_rn(kv, kv));
      }
      tq = __fadd_rn(tq, butterfly(sq));
      tk = __fadd_rn(tk, butterfly(sk));
    }
    __syncwarp();
    const float rq = rsqrtf(tq / DK + eps_qk);
    const float rk = rsqrtf(tk / DK + eps_qk);
    for (int c = lane; c < DK; c += 32) {
      qk[i][c] = round_to(round_to(qk[i][c] * rq, DT) * q_scale, DT);
      qk[i][DK + c] = round_to(round_to(qk[i][DK + c] * rk, DT) * k_scale, DT);
      if (first_of_key) {
        k_tape[(bt * HK + hk) * DK + c] = qk[i][DK + c];
      }
    }
  }
  __syncthreads();

  // B: the recurrence, a state row a thread (or SPLIT threads: then every
  // thread runs it, for the butterflies).
  if (SPLIT > 1 || owns_row) {
    for (int i = 0; i < steps; ++i) {
      const size_t head = (b * T + t0 + i) * HV + hv;
      const float g = gs[i];
      float kv = 0.0f;
#pragma unroll
      for (int l = 0; l < SL; ++l) {
        s[l] = __fmul_rn(s[l], g);
        kv = fmaf(s[l], qk[i][DK + column(l)], kv);
      }
      kv = across(kv);
      const float d = __fmul_rn(__fsub_rn(owns_row ? vs[i][dv] : 0.0f, kv), betas[i]);
      if (owns_row && part == 0) {
        delta[head * DV + dv] = d;
      }
      float acc = 0.0f;
#pragma unroll
      for (int l = 0; l < SL; ++l) {
        s[l] = __fadd_rn(s[l], __fmul_rn(qk[i][DK + column(l)], d));
        acc = fmaf(s[l], qk[i][column(l)], acc);
      }
      acc = across(acc);
      if (owns_row && part == 0) {
        ys[i][dv] = round_to(acc, DT);
      }
    }
  }
  __syncthreads();

  // C1: the gated RMSNorm's factor over each step's DV outputs, a warp a
  // step (every lane ends with the same sum).
  for (int i = warp; i < steps; i += WARPS) {
    float total = 0.0f;
    for (int group = 0; group < RWARPS; ++group) {
      const int tau = 32 * group + lane;
      const float y = tau < DV ? ys[i][tau] : 0.0f;
      total = __fadd_rn(total, butterfly(__fmul_rn(y, y)));
    }
    if (lane == 0) {
      norms[i] = rsqrtf(total / DV + eps_norm);
    }
  }
  __syncthreads();

  // C2: the outputs, every thread on its own (step, row) pairs.
  for (int e = tid; e < steps * DV; e += NT) {
    const int i = e / DV;
    const int row = e % DV;
    const size_t head = (b * T + t0 + i) * HV + hv;
    const float normed = round_to(norm_w[row] * (ys[i][row] * norms[i]), RN);
    const float zf = load(z, head * DV + row);
    const float gate = __fmul_rn(zf, sigmoid(zf));
    store(out, head * DV + row, __fmul_rn(gate, normed));
  }
  __syncthreads();
}

if (owns_row && by_float4(state_out)) {
#pragma unroll
  for (int l = 0; l + 3 < SL; l += 4) {
    *reinterpret_cast<float4*>(state_out + row_at + column(l)) =
        make_float4(s[l], s[l + 1], s[l + 2], s[l + 3]);
  }
} else if (owns_row) {
#pragma unroll
  for (int l = 0; l < SL; ++l) {
    state_out[row_at + column(l)] = s[l];
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
  if (owns_row && part == 0) {
    const int ch = 2 * HK * DK + hv * DV + dv;
    store(conv_out, (b * (K - 1) + r) * C + ch, conv_input(T + r, ch));
  }
}
