// attn_rows: attention for the few queries of a decode step, a verified
// block or a drafted block, each query row computed the same way whatever the
// number of queries (docs/gpu.md, "Row-invariant kernels"), with no plan or
// compiled variant per context length. This is its first half: each block
// scores one chunk of CHUNK keys for the GROUP query heads that share a KV
// head, at one query position, and writes that chunk's partial softmax;
// attn_merge.cu adds the chunks up.
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* q      [B, HQ, T, D]   the T newest positions' queries (RoPE applied)
//   const <T>* k, v   [B, HQ / GROUP, L, D]   the whole cache, the T new positions last
//   const float* scale [1]
//   (plus q's and k's shapes, added by MLX because the body names them)
//   float* part       [B, HQ, T, NCH, D]   sum over the chunk's keys of p * v
//   float* stats      [B, HQ, T, NCH, 2]   the chunk's largest score m and sum of p
// where NCH = ceil(L / CHUNK) and p = exp(score - m). A chunk with no key the
// query attends writes m = -inf, sum 0 (and no part), which the merge skips.
// Template ints: D (head dim: 32, 64, 128 or 256), GROUP (query heads per KV
// head), DT (0 f32, 1 bf16, 2 f16), CAUSAL. B, HQ, T and L are run-time.
// Built with KV_ROOM defined (`row_invariant`'s ATTN_ROOM), k and v are
// buffers with room, [B, HKV, CAP, D], of which the first L positions are
// the cache, and one more parameter gives L:
//   const int* length [1]
// (docs/gpu.md, "A KV cache with room"). Only where a head's rows start
// changes: CAP apart instead of L.
//
// One block of 256 threads (8 warps) per (b, KV head, chunk c, query i),
// i fastest, so the T blocks reading one chunk run side by side and share it
// in L2. CAUSAL: query i sits at position p = L - T + i and attends keys
// 0..p, exactly the keys a decode step at that position sees; otherwise (a
// drafted block) every query attends all L keys. The chunks are cut at
// absolute key indices (c * CHUNK), and within one every sum runs in a fixed
// order over the keys the query attends:
// - scores: warp w takes keys w, w + 8, ...; lane l holds dims l * VEC ..
//   l * VEC + VEC - 1 of each, loaded as one vector across the warp (the key
//   row read whole and in order), a sequential fma over those dims, then a
//   butterfly over the 32 lanes (the same value in every lane);
// - per head: the chunk's largest score, p = exp(s - m), their sum (lane l
//   adds keys l, l + 32, ... in order, then a butterfly);
// - p * v: warp w again over keys w, w + 8, ..., lane l over its dims; the
//   eight warps' sums are then added in warp order.
// A query's chunks, keys and orders depend only on its position, never on T,
// i or how many chunks the cache has beyond its own.

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int CHUNK = 128;
constexpr int VEC = D / 32;
constexpr int LOADS = 4;  // keys a warp loads before it uses them

const int HQ = q_shape[1];
const int T = q_shape[2];
#ifdef KV_ROOM
const int CAP = k_shape[2];
const int L = length[0];
#else
const int L = k_shape[2];
const int CAP = L;
#endif
const int HKV = HQ / GROUP;
const int NCH = (L + CHUNK - 1) / CHUNK;
int at_block = blockIdx.x;
const int i = at_block % T;
at_block /= T;
const int c = at_block % NCH;
at_block /= NCH;
const int kv_head = at_block % HKV;
const int b = at_block / HKV;
const int pos = CAUSAL ? L - T + i : L - 1;
const int first = c * CHUNK;
const int last = min(first + CHUNK - 1, pos);  // the chunk's last attended key
const int tid = threadIdx.x;
const int warp = tid / 32;
const int lane = tid % 32;
const float minus_inf = __int_as_float(0xff800000);

// (b, head, i, c) of head g of this KV head: the row of part and stats.
auto slot = [&](int g) -> size_t {
  return (((size_t)b * HQ + kv_head * GROUP + g) * T + i) * NCH + c;
};

if (last < first) {
  for (int g = tid; g < GROUP; g += THREADS) {
    stats[slot(g) * 2] = minus_inf;
    stats[slot(g) * 2 + 1] = 0.0f;
  }
  return;
}

// VEC consecutive elements from element `at` (a multiple of VEC), as floats.
auto load_vec = [](const void* base, size_t at, float* out) {
  if constexpr (DT == 0) {
    const float* p = reinterpret_cast<const float*>(base) + at;
    if constexpr (VEC % 4 == 0) {
#pragma unroll
      for (int w = 0; w < VEC / 4; ++w) {
        const float4 f = reinterpret_cast<const float4*>(p)[w];
        out[4 * w] = f.x;
        out[4 * w + 1] = f.y;
        out[4 * w + 2] = f.z;
        out[4 * w + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[e] = p[e];
    }
  } else {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(base) + at;
    unsigned short h[VEC];
    if constexpr (VEC % 8 == 0) {
#pragma unroll
      for (int w = 0; w < VEC / 8; ++w) {
        const uint4 u = reinterpret_cast<const uint4*>(p)[w];
        const unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          h[8 * w + 2 * e] = (unsigned short)(words[e] & 0xffff);
          h[8 * w + 2 * e + 1] = (unsigned short)(words[e] >> 16);
        }
      }
    } else if constexpr (VEC % 2 == 0) {
#pragma unroll
      for (int w = 0; w < VEC / 2; ++w) {
        const unsigned int u = reinterpret_cast<const unsigned int*>(p)[w];
        h[2 * w] = (unsigned short)(u & 0xffff);
        h[2 * w + 1] = (unsigned short)(u >> 16);
      }
    } else {
      h[0] = p[0];
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if constexpr (DT == 1) {
        out[e] = __uint_as_float(((unsigned int)h[e]) << 16);
      } else {
        out[e] = __half2float(__ushort_as_half(h[e]));
      }
    }
  }
};

__shared__ float probs[GROUP][CHUNK];
__shared__ float sums[GROUP * D];

const size_t kv_at = ((size_t)b * HKV + kv_head) * CAP * D;
const float sc = scale[0];
float qr[GROUP][VEC];
#pragma unroll
for (int g = 0; g < GROUP; ++g) {
  load_vec(q, (((size_t)b * HQ + kv_head * GROUP + g) * T + i) * D + lane * VEC, qr[g]);
}

// Scores of the attended keys of the chunk, LOADS keys a warp at a time:
// their rows are loaded first, so the loads are in flight together.
#pragma unroll 1
for (int u0 = 0; u0 < CHUNK / WARPS; u0 += LOADS) {
  float kr[LOADS][VEC];
#pragma unroll
  for (int u = 0; u < LOADS; ++u) {
    const int j = first + warp + (u0 + u) * WARPS;
    if (j <= last) load_vec(k, kv_at + (size_t)j * D + lane * VEC, kr[u]);
  }
#pragma unroll
  for (int u = 0; u < LOADS; ++u) {
    const int jj = warp + (u0 + u) * WARPS;
    if (first + jj <= last) {  // the same for the whole warp
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) dot = fmaf(qr[g][e], kr[u][e], dot);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot = dot + __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) probs[g][jj] = dot * sc;
      }
    }
  }
}
__syncthreads();

// Per head: the largest score, the probabilities and their sum.
for (int g = warp; g < GROUP; g += WARPS) {
  float top = minus_inf;
  for (int jj = lane; jj < CHUNK; jj += 32) {
    if (first + jj <= last) top = fmaxf(top, probs[g][jj]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  float total = 0.0f;
  for (int jj = lane; jj < CHUNK; jj += 32) {
    const float p = first + jj <= last ? expf(probs[g][jj] - top) : 0.0f;
    probs[g][jj] = p;
    total = total + p;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total = total + __shfl_xor_sync(0xffffffffu, total, o);
  if (lane == 0) {
    stats[slot(g) * 2] = top;
    stats[slot(g) * 2 + 1] = total;
  }
}
__syncthreads();

// The probabilities times the values.
float acc[GROUP][VEC];
#pragma unroll
for (int g = 0; g < GROUP; ++g) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[g][e] = 0.0f;
}
#pragma unroll 1
for (int u0 = 0; u0 < CHUNK / WARPS; u0 += LOADS) {
  float vr[LOADS][VEC];
#pragma unroll
  for (int u = 0; u < LOADS; ++u) {
    const int j = first + warp + (u0 + u) * WARPS;
    if (j <= last) load_vec(v, kv_at + (size_t)j * D + lane * VEC, vr[u]);
  }
#pragma unroll
  for (int u = 0; u < LOADS; ++u) {
    const int jj = warp + (u0 + u) * WARPS;
    if (first + jj <= last) {
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        const float p = probs[g][jj];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[g][e] = fmaf(p, vr[u][e], acc[g][e]);
      }
    }
  }
}

// The warps' sums, added in warp order.
for (int w = 0; w < WARPS; ++w) {
  if (warp == w) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int at = g * D + lane * VEC + e;
        sums[at] = w == 0 ? acc[g][e] : sums[at] + acc[g][e];
      }
    }
  }
  __syncthreads();
}
for (int at = tid; at < GROUP * D; at += THREADS) {
  part[slot(at / D) * D + at % D] = sums[at];
}
