// attn_merge: the second half of attn_rows.cu's attention: each query's chunk
// partials added into its output, in chunk order (docs/gpu.md,
// "Row-invariant kernels").
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const float* part    [B, HQ, T, NCH, D]   per chunk: sum of p * v
//   const float* stats   [B, HQ, T, NCH, 2]   per chunk: largest score m, sum of p
//   (plus part's shape, added by MLX because the body names it)
//   <T>* out             [B, T, HQ * D]  token-major: as the output projection
//                        reads it, so no copy transposes it (docs/gpu.md)
//   const <T>* gate      [B, T, HQ, 2 D]  with GATE: the query product, each
//                        head's D queries then its D gate values (else unread)
// Template ints: D (head dim), DT (0 f32, 1 bf16, 2 f16), GATE (1: the gated
// attention's output gate, out * sigmoid(gate), bf16 and f16 only). B, HQ,
// T and NCH are run-time.
//
// One block of D threads per query row, thread d for dim d. The chunks the
// query attends are those with a sum of p above 0 (every attended chunk holds
// its largest score's p = 1); others (past the query's position, or past the
// cache of a shorter call) are skipped, so the result is the same however
// many chunks follow. With M the largest m: the output is
// sum_c exp(m_c - M) part_c[d] / sum_c exp(m_c - M) sum_c, each sum in chunk
// order.

const int HQ = part_shape[1];
const int T = part_shape[2];
const int NCH = part_shape[3];
const size_t row = blockIdx.x;  // (b, head, t) of the partials
const int d = threadIdx.x;
const float* st = stats + row * NCH * 2;
float top = __int_as_float(0xff800000);  // -inf
for (int c = 0; c < NCH; ++c) {
  if (st[2 * c + 1] > 0.0f) top = fmaxf(top, st[2 * c]);
}
float total = 0.0f;
float acc = 0.0f;
for (int c = 0; c < NCH; ++c) {
  const float sum = st[2 * c + 1];
  if (sum > 0.0f) {
    const float w = expf(st[2 * c] - top);
    total = fmaf(w, sum, total);
    acc = fmaf(w, part[(row * NCH + c) * D + d], acc);
  }
}
const float value = acc / total;
const size_t b = row / ((size_t)HQ * T);
const int head = (int)(row / T % HQ);
const int t = (int)(row % T);
const size_t at = ((b * T + t) * HQ + head) * D + d;
// Rounded to the activations' type as each MLX op would round its output.
auto round_to = [](float v) -> float {
  if constexpr (DT == 1) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else if constexpr (DT == 2) {
    return __half2float(__float2half_rn(v));
  } else {
    return v;
  }
};
float y = round_to(value);
if constexpr (GATE && DT != 0) {
  // y * sigmoid(g) as MLX's ops compute it (the attention's output rounded,
  // then `sigmoid`: 1 / (1 + e^|g|), mirrored for g >= 0, each step rounded;
  // then `multiply`), the same steps as qmm.cu's GLU end.
  const unsigned short* gs = reinterpret_cast<const unsigned short*>(gate);
  const unsigned short gb = gs[((b * T + t) * HQ + head) * 2 * D + D + d];
  const float g = DT == 1 ? __bfloat162float(__ushort_as_bfloat16(gb))
                          : __half2float(__ushort_as_half(gb));
  const float e = round_to(expf(fabsf(g)));
  const float s0 = round_to(__fdiv_rn(1.0f, round_to(__fadd_rn(1.0f, e))));
  const float sg = g < 0.0f ? s0 : round_to(__fsub_rn(1.0f, s0));
  y = round_to(__fmul_rn(y, sg));
}
if constexpr (DT == 0) {
  reinterpret_cast<float*>(out)[at] = y;
} else if constexpr (DT == 1) {
  reinterpret_cast<unsigned short*>(out)[at] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
} else {
  reinterpret_cast<unsigned short*>(out)[at] = __half_as_ushort(__float2half_rn(y));
}
