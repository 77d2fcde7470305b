// qmm: y = x . dequantize(w)^T for MLX's affine-quantized weights, for the
// few rows of a decode step (M = 1) or a verified block (M <= 32), and a
// prefill's many rows 32 or 64 at a time, with every
// row summed in the same order whatever M is (docs/gpu.md, "Row-invariant
// kernels"; its speed: "The quantized matmul").
//
// A kernel BODY for MLX's fast::cuda_kernel (kernels/README.md). Parameters:
//   const <T>* x            [B, T, K] (M = B T rows), or [M, K] with GATHER:
//                           activations, bf16 (HALF = 0) or f16 (HALF = 1); the
//                           model's own shape, so no reshape node precedes a call
//   const uint32_t* w       [N, K * BITS / 32]  packed as MLX packs them
//   const <T>* scales       [N, K / GS]
//   const <T>* biases       [N, K / GS]
//   (plus x's, w's and scales' shapes, added by MLX because the body names them)
//   const <T>* res          [.., NO] (M rows) added to the output when RES (else unread)
//   <T>* y                  [.., NO] (M rows, x's leading shape)  NO = N, or N / 2 with GLU
// Template ints: BITS (4 | 8), HALF, NT (8-column tiles per warp: 1, 2, 4, 8), MT (16-row
// tiles: M <= 16 or M <= 32; 4, a prefill's 64-row tiles), and the
// fused ends (docs/gpu.md, "Fused ends"):
// GLU = 1 (with NT = 4) when the weight is a SwiGLU's gate and up maps with
// their rows paired, 16 of gate then the same 16 of up in every 32, and y is
// silu(gate) * up; RES = 1 when y is res + the output. Both act on each
// output alone, after its sum: the same for every M.
// P1, P2, P3 > 0 split the output by parts (docs/gpu.md, "Stacked maps' parts
// apart"): the columns where parts 1, 2 and 3 of a stacked weight start (0:
// no such part), and y holds each part's [M, width] rows in turn, so that
// every part is a contiguous array (not with GLU, RES or GATHER). Only where
// an output is stored changes.
// GATHER = 1 for a MoE's experts (docs/gpu.md, "The experts"): w, scales and
// biases hold one map per expert ([E, N, ..]), and
//   const int32_t* pairs    [2, P]   the input row and the expert of each output row
// (else unread); y is [P, NO]. Block (column block, expert e) takes the pairs
// routed to e, in order, 32 at a time (64 with MT = 4) as the rows of its tile, and returns at
// once where there are none: a decode step's or a verified block's expert
// has at most 32 (a token meets an expert once), so its weights are read once
// for all its rows; a prefill's expert may have hundreds, one tile after
// another. A row is summed as it would be alone, wherever it sits in
// whichever tile (as for M rows above). Where there are fewer pairs than
// experts (a decode step: 8 of 256) the grid's second axis may run over
// the pairs instead (a grid of P < E), and the block of pair p takes p's expert if p is its first
// pair (else it returns): the same tiles, a grid of P blocks a column block
// in place of E, most of which would find nothing.
// Dense calls of more than 32 rows (a prefill's) run a block per 32-row tile
// (64 with MT = 4) and column block, each tile as a call of its rows alone
// (below).
// Run-time: M, K, N, the group size
// K / groups (32, 64 or 128) and the block's warps (1 .. MAX_WARPS,
// splitting K; many warps a block keep a small layer's latency low,
// docs/gpu.md "The quantized matmul").
//
// The product runs on the tensor cores (mma.sync m16n8k16, f32 accumulate):
// a warp computes a 16-row x 8-column tile per instruction, and rows past M
// are zeros. Lane (g, t) (g = lane / 4, t = lane % 4) loads VALS consecutive
// k values of column g (16 bytes of packed weights) and the same k values of
// rows g and g + 8 of x, and feeds them to the instruction's k slots 2t, 2t+1,
// 2t+8, 2t+9, a pair of values per register. Any permutation of k applied to
// A and B alike leaves the product unchanged; the 4-bit path pairs value i of
// a packed word with value i + 4 (below), and permutes x to match.
//
// Why rows do not depend on M: one output element is the sum, per mma, of its
// own row of A times one column of B, added to its accumulator; which rows
// exist changes which A registers hold zeros, never the instructions, their
// order, or the k split. NT and the warps are chosen from the weight's
// shape only (flashbar_mlx::row_invariant::qmm_launch), and the partial sums
// of the block's warps are added in warp order. M = 17..32 runs a second
// 16-row tile beside the first with the same instructions; MT = 4 four of
// them, each dequantized weight feeding all four (its loop takes x a
// 16-byte load at a time, so that 64 rows fit the registers, and each
// accumulator still takes its products in the same order).
//
// Dequantization (w = scale * q + bias), with no int-to-float conversion
// (a quarter-rate instruction that bounded the first version of this kernel):
// - 4 bits: (word >> 4i) & 0x000F000F | 0x4300 4300 is the bf16 pair
//   (128 + q_i, 128 + q_(i+4)) (for f16, 0x6400: 1024 + q); one paired fma
//   subtracts the 128 exactly, a second computes scale * q + bias, rounded
//   once to the activations' type.
// - 8 bits: byte i of a word becomes the f32 2^23 + q (one byte permute),
//   2^23 is subtracted exactly, then fmaf(scale, q, bias) in f32 is rounded
//   to the activations' type (the value MLX's own dequantize gives).

#if PACKED
// The template ints packed into three (a call's host cost grows with each
// template value: docs/gpu.md, "What a call costs the host, by kind"): CFG
// holds BITS (bits 0-3), HALF (4), NT (5-8), MT (9-11), GLU (12), RES (13) and
// GATHER (14-15); P12 holds P1 (bits 0-14) and P2 (15-29); P3 as it is.
constexpr int BITS = CFG & 15;
constexpr int HALF = (CFG >> 4) & 1;
constexpr int NT = (CFG >> 5) & 15;
constexpr int MT = (CFG >> 9) & 7;
constexpr int GLU = (CFG >> 12) & 1;
constexpr int RES = (CFG >> 13) & 1;
constexpr int GATHER = (CFG >> 14) & 3;
constexpr int P1 = P12 & 0x7FFF;
constexpr int P2 = (P12 >> 15) & 0x7FFF;
#endif

constexpr int VALS = 128 / BITS;        // k values per lane per 16-byte load
constexpr int CHUNK = 4 * VALS;         // k values of one warp step
constexpr int XV = VALS / 8;            // 16-byte loads of one row of x per chunk

// 512 threads a block at most (1,024 ask for more registers than an SM has),
// 256 with four tiles; their partial sums fit 32 KB of shared memory. Eight
// tiles (NT = 8, tried by bench/qmm_tune.py only: at M = 16 every lane
// reads twice as many bytes of x as of weights with four) keep 8 warps, 4
// with a second row tile, within the same 32 KB.
// The partial sums go through shared memory two row tiles at a time (MT = 4
// in two passes), so the same 32 KB hold them.
constexpr int MT_PASS = MT > 2 ? 2 : MT;
constexpr int MAX_WARPS = NT == 8 ? (MT_PASS == 2 ? 4 : 8) : NT == 4 ? 8 : 16;
// Rows a block's tile holds past 32 rows (a prefill's): a dense call's, an expert's.
constexpr int TILE_ROWS = MT == 4 ? 64 : 32;

int M = GATHER ? x_shape[0] : x_shape[0] * x_shape[1];
const int K = x_shape[GATHER ? 1 : 2];
const int N = w_shape[GATHER ? 1 : 0];
const int KW = K * BITS / 32;
const int G = scales_shape[GATHER ? 2 : 1];
const int GS = K / G;
const int warps = blockDim.x >> 5;

const int lane = threadIdx.x & 31;
const int warp = threadIdx.x >> 5;

// GATHER: this block's expert's pairs, found by the first warp in order,
// the TILE_ROWS from `tile0` on as this pass's tile. Without GATHER one pass.
const int* pr = reinterpret_cast<const int*>(pairs);
__shared__ int tile_pair[TILE_ROWS];
__shared__ int tile_rows;
size_t first_row = 0;  // the expert's first row of w, scales and biases
int e = blockIdx.y;     // GATHER: the block's expert
if constexpr (GATHER) {
  const int P = pairs_shape[1];
  if ((int)gridDim.y < w_shape[0]) {
    // By pair (the grid's second axis is P < E): the expert of pair
    // blockIdx.y, unless an earlier pair has it.
    __shared__ int earlier;
    e = pr[P + blockIdx.y];
    if (warp == 0) {
      bool seen = false;
      for (int base = 0; base < (int)blockIdx.y; base += 32) {
        const int p = base + lane;
        seen |= __any_sync(0xFFFFFFFFu, p < (int)blockIdx.y && pr[P + p] == e);
      }
      if (lane == 0) earlier = seen;
    }
    __syncthreads();
    if (earlier) return;
  }
}
// Dense: a call of more than 32 rows (a prefill's) has a block per 32-row
// tile and column block (the grid's second axis counts the tiles), and
// each tile is summed exactly as a call of those rows alone. The blocks are
// taken in bands of BAND tiles a column block, so that a band's blocks
// read the same weights while the L2 holds them, and x's band stays there.
const int M_all = M;
size_t row0 = 0;
int n_block = blockIdx.x;
if constexpr (!GATHER) {
  if (gridDim.y > 1) {
    constexpr int BAND = 8;
    const int cols = gridDim.x;
    const int lin = blockIdx.y * cols + blockIdx.x;
    const int band = lin / (cols * BAND);
    const int in_band = min(BAND, (int)gridDim.y - band * BAND);
    const int within = lin - band * cols * BAND;
    n_block = within / in_band;
    row0 = (size_t)(band * BAND + within % in_band) * TILE_ROWS;
    M = min(M_all - (int)row0, TILE_ROWS);
  }
}
for (int tile0 = 0;; tile0 += TILE_ROWS) {
if constexpr (GATHER) {
  const int P = pairs_shape[1];
  // The last pass's stores read tile_pair and its sums `partial`: all done.
  __syncthreads();
  if (warp == 0) {
    int found = 0;
    for (int base = 0; base < P; base += 32) {
      const int p = base + lane;
      const bool mine = p < P && pr[P + p] == e;
      const unsigned int ballot = __ballot_sync(0xFFFFFFFFu, mine);
      const int at = found + __popc(ballot & ((1u << lane) - 1u));
      if (mine && at >= tile0 && at < tile0 + TILE_ROWS) tile_pair[at - tile0] = p;
      found += __popc(ballot);
    }
    if (lane == 0) tile_rows = min(max(found - tile0, 0), TILE_ROWS);
  }
  __syncthreads();
  M = tile_rows;
  if (M == 0) break;
  first_row = (size_t)e * N;
} else if (tile0 > 0) {
  break;
}
// Row r of the tile: the row of x it reads, the row of y it writes.
auto x_row = [&](int r) -> size_t { return GATHER ? (size_t)pr[tile_pair[r]] : row0 + r; };
auto y_row = [&](int r) -> size_t { return GATHER ? (size_t)tile_pair[r] : row0 + r; };
const int g = lane >> 2;
const int t = lane & 3;
const int n0 = n_block * (NT * 8);

const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
const unsigned short* ss = reinterpret_cast<const unsigned short*>(scales);
const unsigned short* bs = reinterpret_cast<const unsigned short*>(biases);
const unsigned short* rs = reinterpret_cast<const unsigned short*>(res);
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
// d = a * b + c on a pair of bf16 (f16) values, rounded once.
auto fma2 = [](unsigned int a, unsigned int b, unsigned int c) -> unsigned int {
  unsigned int d;
  if constexpr (HALF) {
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
};
// silu(g) * u of one value, each step rounded to the activations' type as
// MLX's ops round it (sigmoid as 1 / (1 + e^|g|), mirrored for g >= 0).
auto glu = [&](unsigned short gb, unsigned short ub) -> unsigned short {
  auto r = [&](float v) { return to_float(from_float(v)); };
  const float gv = to_float(gb);
  const float e = r(expf(fabsf(gv)));
  const float s0 = r(__fdiv_rn(1.0f, r(__fadd_rn(1.0f, e))));
  const float s = gv < 0.0f ? s0 : r(__fsub_rn(1.0f, s0));
  return from_float(__fmul_rn(r(__fmul_rn(gv, s)), to_float(ub)));
};
auto mma = [](float* d, unsigned int a0, unsigned int a1, unsigned int a2, unsigned int a3,
              unsigned int b0, unsigned int b1) {
  if constexpr (HALF) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};
// 128 + q (bf16) or 1024 + q (f16) in each half, and the pairs 1 and -128 (-1024).
constexpr unsigned int MAGIC = HALF ? 0x64006400u : 0x43004300u;
constexpr unsigned int ONES = HALF ? 0x3C003C00u : 0x3F803F80u;
constexpr unsigned int MINUS_MAGIC = HALF ? 0xE400E400u : 0xC300C300u;

float acc[MT][NT][4];
#pragma unroll
for (int mt = 0; mt < MT; ++mt)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

const int chunks = (K + CHUNK - 1) / CHUNK;
// Not unrolled: unrolling twice (so the next chunk's loads could issue
// before this chunk's products), or loading the next chunk by hand before
// them, was slower or no faster on an H100 (docs/gpu.md, "Weight loads
// ahead of the products": more registers, fewer warps resident).
#pragma unroll 1
for (int c = warp; c < chunks; c += warps) {
  const int k0 = c * CHUNK + t * VALS;
  const bool live = k0 < K;
  // The chunk's weights first: NT 16-byte loads a lane in flight while x is read.
  uint4 q[NT];
  unsigned short sc[NT], bi[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = n0 + nt * 8 + g;
    if (live && n < N) {
      q[nt] = __ldg(reinterpret_cast<const uint4*>(w + (first_row + n) * KW + k0 * BITS / 32));
      sc[nt] = ss[(first_row + n) * G + k0 / GS];
      bi[nt] = bs[(first_row + n) * G + k0 / GS];
    } else {
      q[nt] = make_uint4(0u, 0u, 0u, 0u);
      sc[nt] = 0;
      bi[nt] = 0;
    }
  }

  if constexpr (MT == 4) {
    // x one 16-byte load (of each of the 64 rows) at a time, then every tile's
    // words that load pairs with: for each (tile, row tile) the products come
    // in the order of the branch below. Not unrolled: unrolled, the
    // compiler holds every load's x at once and runs out of registers.
#pragma unroll 1
    for (int i = 0; i < XV; ++i) {
      unsigned int a[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mt * 16 + h * 8 + g;
          if (live && row < M) {
            const uint4 v = reinterpret_cast<const uint4*>(xs + x_row(row) * K + k0)[i];
            if constexpr (BITS == 4) {
              a[mt][h][0] = __byte_perm(v.x, v.z, 0x5410);
              a[mt][h][1] = __byte_perm(v.x, v.z, 0x7632);
              a[mt][h][2] = __byte_perm(v.y, v.w, 0x5410);
              a[mt][h][3] = __byte_perm(v.y, v.w, 0x7632);
            } else {
              a[mt][h][0] = v.x;
              a[mt][h][1] = v.y;
              a[mt][h][2] = v.z;
              a[mt][h][3] = v.w;
            }
          } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) a[mt][h][r] = 0u;
          }
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if constexpr (BITS == 4) {
          // Load i is word i's eight values.
          const unsigned int word = i == 0 ? q[nt].x : i == 1 ? q[nt].y : i == 2 ? q[nt].z : q[nt].w;
          const unsigned int s2 = (unsigned int)sc[nt] * 0x10001u;
          const unsigned int b2 = (unsigned int)bi[nt] * 0x10001u;
          unsigned int v[4];
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const unsigned int biased = ((word >> (4 * p)) & 0x000F000Fu) | MAGIC;
            v[p] = fma2(fma2(biased, ONES, MINUS_MAGIC), s2, b2);
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(acc[mt][nt], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], v[0], v[1]);
            mma(acc[mt][nt], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], v[2], v[3]);
          }
        } else {
          // Load i is words 2i and 2i + 1, four values each.
          const float scale = to_float(sc[nt]);
          const float bias = to_float(bi[nt]);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const unsigned int word = i == 0 ? (jj == 0 ? q[nt].x : q[nt].y) : (jj == 0 ? q[nt].z : q[nt].w);
            float f[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              const float qv = __uint_as_float(__byte_perm(word, 0x4Bu, 0x4550 + p)) - 8388608.0f;
              f[p] = fmaf(scale, qv, bias);
            }
            const unsigned int b0 = pack(f[0], f[1]);
            const unsigned int b1 = pack(f[2], f[3]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma(acc[mt][nt], a[mt][0][2 * jj], a[mt][1][2 * jj], a[mt][0][2 * jj + 1],
                  a[mt][1][2 * jj + 1], b0, b1);
          }
        }
      }
    }
  } else {
    // A: rows g and g + 8 of each 16-row tile, this lane's VALS values as
    // pairs, in the order the weights' pairs come in (4 bits: value i with i + 4).
    unsigned int a[MT][2][VALS / 2];
  #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
  #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mt * 16 + h * 8 + g;
        if (live && row < M) {
          const uint4* p = reinterpret_cast<const uint4*>(xs + x_row(row) * K + k0);
  #pragma unroll
          for (int i = 0; i < XV; ++i) {
            const uint4 v = p[i];
            if constexpr (BITS == 4) {
              a[mt][h][4 * i] = __byte_perm(v.x, v.z, 0x5410);      // x0, x4
              a[mt][h][4 * i + 1] = __byte_perm(v.x, v.z, 0x7632);  // x1, x5
              a[mt][h][4 * i + 2] = __byte_perm(v.y, v.w, 0x5410);  // x2, x6
              a[mt][h][4 * i + 3] = __byte_perm(v.y, v.w, 0x7632);  // x3, x7
            } else {
              a[mt][h][4 * i] = v.x;
              a[mt][h][4 * i + 1] = v.y;
              a[mt][h][4 * i + 2] = v.z;
              a[mt][h][4 * i + 3] = v.w;
            }
          }
        } else {
  #pragma unroll
          for (int i = 0; i < VALS / 2; ++i) a[mt][h][i] = 0u;
        }
      }

  #pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const unsigned int words[4] = {q[nt].x, q[nt].y, q[nt].z, q[nt].w};
      if constexpr (BITS == 4) {
        const unsigned int s2 = (unsigned int)sc[nt] * 0x10001u;
        const unsigned int b2 = (unsigned int)bi[nt] * 0x10001u;
  #pragma unroll
        for (int j = 0; j < 4; ++j) {
          // Word j holds values 8j .. 8j+7 of the lane's VALS; pair p is (p, p + 4).
          unsigned int v[4];
  #pragma unroll
          for (int p = 0; p < 4; ++p) {
            const unsigned int biased = ((words[j] >> (4 * p)) & 0x000F000Fu) | MAGIC;
            v[p] = fma2(fma2(biased, ONES, MINUS_MAGIC), s2, b2);
          }
  #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(acc[mt][nt], a[mt][0][4 * j], a[mt][1][4 * j], a[mt][0][4 * j + 1], a[mt][1][4 * j + 1],
                v[0], v[1]);
            mma(acc[mt][nt], a[mt][0][4 * j + 2], a[mt][1][4 * j + 2], a[mt][0][4 * j + 3],
                a[mt][1][4 * j + 3], v[2], v[3]);
          }
        }
      } else {
        const float scale = to_float(sc[nt]);
        const float bias = to_float(bi[nt]);
  #pragma unroll
        for (int j = 0; j < 4; ++j) {
          // Word j holds values 4j .. 4j+3, in natural order.
          float f[4];
  #pragma unroll
          for (int p = 0; p < 4; ++p) {
            const float qv = __uint_as_float(__byte_perm(words[j], 0x4Bu, 0x4550 + p)) - 8388608.0f;
            f[p] = fmaf(scale, qv, bias);
          }
          const unsigned int b0 = pack(f[0], f[1]);
          const unsigned int b1 = pack(f[2], f[3]);
  #pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            mma(acc[mt][nt], a[mt][0][2 * j], a[mt][1][2 * j], a[mt][0][2 * j + 1], a[mt][1][2 * j + 1],
                b0, b1);
        }
      }
    }
  }
}

// Output columns: N, or with GLU one per gate / up pair.
const int NO = GLU ? N / 2 : N;
// Where output (row, col) is stored: row by row, or part by part (P1..P3).
auto y_at = [&](int row, int col) -> size_t {
  if constexpr (P1 > 0) {
    int start = 0, end = P1;
    if (col >= P1) start = P1, end = P2 > 0 ? P2 : NO;
    if (P2 > 0 && col >= P2) start = P2, end = P3 > 0 ? P3 : NO;
    if (P3 > 0 && col >= P3) start = P3, end = NO;
    return (size_t)start * M_all + y_row(row) * (end - start) + (col - start);
  } else {
    return y_row(row) * NO + col;
  }
};
auto put = [&](int row, int col, float v) {
  if (row < M && col < NO) {
    if constexpr (RES) v = __fadd_rn(to_float(rs[y_row(row) * NO + col]), to_float(from_float(v)));
    ys[y_at(row, col)] = from_float(v);
  }
};
// Accumulator e of lane (g, t): row g + 8 * (e / 2), column 2t + e % 2 of
// tile nt. With GLU, tiles 0 and 1 hold the block's 16 gate columns and
// tiles 2 and 3 the same 16 of up: `up` is tile nt + 2's sum.
auto store = [&](int mt, int nt, int e, int at_lane, float v, float up) {
  const int row = mt * 16 + (at_lane >> 2) + 8 * (e >> 1);
  const int col = nt * 8 + 2 * (at_lane & 3) + (e & 1);
  if constexpr (GLU) {
    put(row, n0 / 2 + col, to_float(glu(from_float(v), from_float(up))));
  } else {
    put(row, n0 + col, v);
  }
};
constexpr int NT_OUT = GLU ? NT / 2 : NT;

if (warps == 1) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT_OUT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        store(mt, nt, e, lane, acc[mt][nt][e], acc[mt][(nt + NT_OUT) % NT][e]);
} else {
  // The warps' partial sums, added in warp order, MT_PASS row tiles a pass.
  constexpr int PER_WARP = MT_PASS * NT * 4 * 32;
  __shared__ float partial[MAX_WARPS * PER_WARP];
#pragma unroll
  for (int m0 = 0; m0 < MT; m0 += MT_PASS) {
    if (m0 > 0) __syncthreads();  // the last pass's sums are read
#pragma unroll
    for (int mt = 0; mt < MT_PASS; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          partial[warp * PER_WARP + ((mt * NT + nt) * 4 + e) * 32 + lane] = acc[m0 + mt][nt][e];
    __syncthreads();
    auto sum = [&](int idx) {
      float v = partial[idx];
      for (int other = 1; other < warps; ++other) v = __fadd_rn(v, partial[other * PER_WARP + idx]);
      return v;
    };
    for (int idx = threadIdx.x; idx < PER_WARP; idx += warps * 32) {
      const int tile = idx >> 7;
      if (tile % NT >= NT_OUT) continue;
      const float up = GLU ? sum(idx + NT_OUT * 128) : 0.0f;
      store(m0 + tile / NT, tile % NT, (idx >> 5) & 3, idx & 31, sum(idx), up);
    }
  }
}
}  // one pass a tile of the expert's pairs
