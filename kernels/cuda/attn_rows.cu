// attn_rows: attention for the few queries of a decode step, a verified
// block or a drafted block, each query row computed the same way whatever the
// number of queries (docs/gpu.md, "Row-invariant kernels"), with no plan or
// compiled variant per context length.
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* q      [B, HQ, T, D]   the T newest positions' queries (RoPE applied)
//   const <T>* k, v   [B, HQ / GROUP, L, D]   the whole cache, the T new positions last
//   const float* scale [1]
//   (plus q's and k's shapes, added by MLX because the body names them)
//   <T>* out          [B, HQ, T, D]
// Template ints: D (head dim, a multiple of 32, at most 256), GROUP (query
// heads per KV head), DT (0 f32, 1 bf16, 2 f16), CAUSAL. B, HQ, T and L are
// run-time.
//
// One block of 256 threads per (b, head, query). CAUSAL: query i sits at
// position p = L - T + i and attends keys 0..p, exactly the keys a decode step
// at that position sees. Otherwise (a drafted block) every query attends all
// L keys. Every sum runs over absolute key indices in a fixed order:
// - pass 1: thread j takes keys j, j + 256, ...: scores (a sequential dot
//   over D), their maximum (exact in any order);
// - pass 2: tiles of 256 keys from key 0: each thread computes one
//   probability exp(s - max); the thread for (part h, dim d) adds p * v[d]
//   over its part of the tile in key order; per-thread sums of p and the
//   parts are added in a fixed order at the end.
// Nothing depends on T or on the query's place in the block.

constexpr int THREADS = 256;
constexpr int PARTS = THREADS / D;

const int HQ = q_shape[1];
const int T = q_shape[2];
const int L = k_shape[2];
const int row = blockIdx.x;           // (b * HQ + head) * T + i
const int i = row % T;
const int bh = row / T;
const int head = bh % HQ;
const int b = bh / HQ;
const int kv_head = head / GROUP;
const int HKV = HQ / GROUP;
const int pos = CAUSAL ? L - T + i : L - 1;
const int tid = threadIdx.x;

auto load = [](const void* base, size_t idx) -> float {
  if constexpr (DT == 0) {
    return reinterpret_cast<const float*>(base)[idx];
  } else if constexpr (DT == 1) {
    return __uint_as_float(((unsigned int)reinterpret_cast<const unsigned short*>(base)[idx]) << 16);
  } else {
    return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(base)[idx]));
  }
};

__shared__ float qs[D];
__shared__ float probs[THREADS];
__shared__ float reduce[THREADS];
__shared__ float parts[PARTS * D];

const size_t q_at = (size_t)row * D;
const size_t kv_at = ((size_t)b * HKV + kv_head) * L * D;
const float sc = scale[0];
for (int d = tid; d < D; d += THREADS) qs[d] = load(q, q_at + d);
__syncthreads();

auto score = [&](int j) -> float {
  const size_t at = kv_at + (size_t)j * D;
  float dot = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) dot = fmaf(qs[d], load(k, at + d), dot);
  return dot * sc;
};

// Pass 1: the largest score.
float best = __int_as_float(0xff800000);  // -inf
for (int j = tid; j <= pos; j += THREADS) best = fmaxf(best, score(j));
reduce[tid] = best;
__syncthreads();
for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
  if (tid < stride) reduce[tid] = fmaxf(reduce[tid], reduce[tid + stride]);
  __syncthreads();
}
const float top = reduce[0];
__syncthreads();

// Pass 2: probabilities and the weighted sum of values, tile by tile.
const int part = tid / D;
const int dim = tid % D;
float total = 0.0f;
float acc = 0.0f;
for (int base = 0; base <= pos; base += THREADS) {
  const int j = base + tid;
  const float p = j <= pos ? expf(score(j) - top) : 0.0f;
  total += p;
  probs[tid] = p;
  __syncthreads();
  const int first = part * D;
  for (int jj = first; jj < first + D && base + jj <= pos; ++jj) {
    acc = fmaf(probs[jj], load(v, kv_at + (size_t)(base + jj) * D + dim), acc);
  }
  __syncthreads();
}

// The sums of p, in a fixed tree order; the parts, in part order.
reduce[tid] = total;
parts[part * D + dim] = acc;
__syncthreads();
for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
  if (tid < stride) reduce[tid] = reduce[tid] + reduce[tid + stride];
  __syncthreads();
}
if (tid < D) {
  float sum = parts[tid];
#pragma unroll
  for (int h = 1; h < PARTS; ++h) sum = sum + parts[h * D + tid];
  const float value = sum / reduce[0];
  const size_t at = q_at + tid;
  if constexpr (DT == 0) {
    reinterpret_cast<float*>(out)[at] = value;
  } else if constexpr (DT == 1) {
    reinterpret_cast<unsigned short*>(out)[at] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  } else {
    reinterpret_cast<unsigned short*>(out)[at] = __half_as_ushort(__float2half_rn(value));
  }
}
