// qmm: y = x . dequantize(w)^T for MLX's affine-quantized weights, for the
// few rows of a decode step (M = 1) or a verified block (M <= 32), with every
// row summed in the same order whatever M is (docs/gpu.md, "Row-invariant
// kernels").
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* x            [M, K]   activations, bf16 (HALF = 0) or f16 (HALF = 1)
//   const uint32_t* w       [N, K * BITS / 32]  packed as MLX packs them
//   const <T>* scales       [N, K / GS]
//   const <T>* biases       [N, K / GS]
//   (plus x's, w's and scales' shapes, added by MLX because the body names them)
//   <T>* y                  [M, N]
// Template ints: BITS (4 | 8), HALF, NT (8-column tiles per warp), MT (16-row
// tiles: M <= 16 or M <= 32). Run-time: M, K, N, the group size K / groups
// (32, 64 or 128) and the block's warps (1..8, splitting K), so that a model
// needs few compiled variants (MLX compiles each on first use, seconds each).
//
// The product runs on the tensor cores (mma.sync m16n8k16, f32 accumulate):
// a warp computes a 16-row x 8-column tile per instruction, and rows past M
// are zeros. Lane (g, t) (g = lane / 4, t = lane % 4) holds the 4-lane slice
// t of the instruction's 16 k slots: this kernel gives each lane VALS
// consecutive k values (one 16-byte load of packed weights for column g) and
// feeds them to the instruction's slots 2t, 2t+1, 2t+8, 2t+9 four at a time;
// the same k values of rows g and g+8 of x go in the A slots of that lane.
// Permuting k identically in A and B leaves the product unchanged.
//
// Why rows do not depend on M: one output element is the sum, per mma, of its
// own row of A times one column of B, added to its accumulator; which rows
// exist changes which A registers hold zeros, never the instructions, their
// order, or the k split. The warps and NT are chosen from the weight's shape only
// (flashbar_mlx::row_invariant::qmm_launch), and the partial sums of the block's warps
// are added in warp order. M = 17..32 runs a second 16-row tile beside the
// first with the same instructions.
//
// Dequantization: w = scale * q + bias in f32 (one fmaf), rounded to T, the
// value MLX's own dequantize gives.

constexpr int VALS = 128 / BITS;        // k values per lane per 16-byte load
constexpr int CHUNK = 4 * VALS;         // k values of one warp step
constexpr int MMAS = VALS / 4;          // instructions per load
constexpr int PER_WORD = 32 / BITS;     // values per packed word
constexpr unsigned int MASK = (1u << BITS) - 1u;

constexpr int MAX_WARPS = 8;

const int M = x_shape[0];
const int K = x_shape[1];
const int N = w_shape[0];
const int KW = K / PER_WORD;
const int G = scales_shape[1];
const int GS = K / G;
const int warps = blockDim.x >> 5;

const int lane = threadIdx.x & 31;
const int warp = threadIdx.x >> 5;
const int g = lane >> 2;
const int t = lane & 3;
const int n0 = blockIdx.x * (NT * 8);

const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
const unsigned short* ss = reinterpret_cast<const unsigned short*>(scales);
const unsigned short* bs = reinterpret_cast<const unsigned short*>(biases);
unsigned short* ys = reinterpret_cast<unsigned short*>(y);

auto to_float = [](unsigned short bits) -> float {
  if constexpr (HALF) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(((unsigned int)bits) << 16);
  }
};
auto pack = [](float lo, float hi) -> unsigned int {
  if constexpr (HALF) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&h);
  }
};
auto from_float = [](float v) -> unsigned short {
  if constexpr (HALF) {
    return __half_as_ushort(__float2half_rn(v));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

float acc[MT][NT][4];
#pragma unroll
for (int mt = 0; mt < MT; ++mt)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

const int chunks = (K + CHUNK - 1) / CHUNK;
for (int c = warp; c < chunks; c += warps) {
  const int k0 = c * CHUNK + t * VALS;
  const bool live = k0 < K;

  // A: rows g and g + 8 of each 16-row tile, this lane's VALS values as pairs.
  unsigned int a[MT][2][VALS / 2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + h * 8 + g;
      if (live && row < M) {
        const uint4* p = reinterpret_cast<const uint4*>(xs + (size_t)row * K + k0);
#pragma unroll
        for (int i = 0; i < VALS / 8; ++i) {
          const uint4 v = p[i];
          a[mt][h][4 * i] = v.x;
          a[mt][h][4 * i + 1] = v.y;
          a[mt][h][4 * i + 2] = v.z;
          a[mt][h][4 * i + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < VALS / 2; ++i) a[mt][h][i] = 0u;
      }
    }

#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = n0 + nt * 8 + g;
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    float scale = 0.0f, bias = 0.0f;
    if (live && n < N) {
      q = *reinterpret_cast<const uint4*>(w + (size_t)n * KW + k0 / PER_WORD);
      scale = to_float(ss[(size_t)n * G + k0 / GS]);
      bias = to_float(bs[(size_t)n * G + k0 / GS]);
    }
    const unsigned int words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < MMAS; ++i) {
      const unsigned int word = words[(4 * i) / PER_WORD];
      const int shift = ((4 * i) % PER_WORD) * BITS;
      const float w0 = fmaf(scale, (float)((word >> shift) & MASK), bias);
      const float w1 = fmaf(scale, (float)((word >> (shift + BITS)) & MASK), bias);
      const float w2 = fmaf(scale, (float)((word >> (shift + 2 * BITS)) & MASK), bias);
      const float w3 = fmaf(scale, (float)((word >> (shift + 3 * BITS)) & MASK), bias);
      const unsigned int b0 = pack(w0, w1);
      const unsigned int b1 = pack(w2, w3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float* d = acc[mt][nt];
        if constexpr (HALF) {
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
              "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
              : "r"(a[mt][0][2 * i]), "r"(a[mt][1][2 * i]), "r"(a[mt][0][2 * i + 1]),
                "r"(a[mt][1][2 * i + 1]), "r"(b0), "r"(b1));
        } else {
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
              "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
              : "r"(a[mt][0][2 * i]), "r"(a[mt][1][2 * i]), "r"(a[mt][0][2 * i + 1]),
                "r"(a[mt][1][2 * i + 1]), "r"(b0), "r"(b1));
        }
      }
    }
  }
}

// Accumulator e of lane (g, t): row g + 8 * (e / 2), column 2t + e % 2.
auto store = [&](int mt, int nt, int e, int at_lane, float v) {
  const int row = mt * 16 + (at_lane >> 2) + 8 * (e >> 1);
  const int col = n0 + nt * 8 + 2 * (at_lane & 3) + (e & 1);
  if (row < M && col < N) ys[(size_t)row * N + col] = from_float(v);
};

if (warps == 1) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) store(mt, nt, e, lane, acc[mt][nt][e]);
} else {
  // The warps' partial sums, added in warp order.
  constexpr int PER_WARP = MT * NT * 4 * 32;
  __shared__ float partial[MAX_WARPS * PER_WARP];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        partial[warp * PER_WARP + ((mt * NT + nt) * 4 + e) * 32 + lane] = acc[mt][nt][e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < PER_WARP; idx += warps * 32) {
    float v = partial[idx];
    for (int other = 1; other < warps; ++other) v = __fadd_rn(v, partial[other * PER_WARP + idx]);
    const int at_lane = idx & 31;
    const int e = (idx >> 5) & 3;
    const int tile = idx >> 7;
    store(tile / NT, tile % NT, e, at_lane, v);
  }
}
