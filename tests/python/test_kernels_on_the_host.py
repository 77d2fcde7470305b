"""A CUDA kernel body whose threads do not cooperate (no shared memory, no
barriers, no shuffles) runs on the host too: compiled by the system's C++
compiler with the few CUDA names it uses defined, its function called for
every (block, thread) in turn. Then its values can be checked here, on a
machine without a GPU, against the arithmetic it claims.

`kernels/cuda/gdn_replay.cu` (a rollback's replay of a gated-delta tape):
its result must equal the recurrence s = s * g; s = s + k * delta, each op
rounded once (numpy's float32 arithmetic), bit for bit, on the float4 path
(aligned arrays) and on the scalar one (arrays one float off alignment).

Kernels whose threads cooperate run with an OS thread a CUDA thread (below):
`kernels/cuda/gdn_layer.cu`, a thread a state row and four, must give a
block of tokens what its one-token calls give, bit for bit (what lossless
DFlash needs), and four threads a row what one does within rounding. The
host's rsqrtf and expf are not the GPU's, so these check the kernel's
logic, not the GPU's bits (bench/h200-steps.sh gdn checks those).
`kernels/cuda/attn_rows.cu` and `attn_merge.cu` likewise: each query of a
verified block gets what the one-query call at its position gets, bit for
bit, and what numpy's softmax attention gives. `kernels/cuda/conv_rows.cu`:
its stated sum, bit for bit, for a block and for each position alone.
"""

import ctypes
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

if sys.platform != "linux":
    # The CUDA kernels are the Linux build's; these checks run with its tests.
    pytest.skip("the host runs of CUDA kernel bodies are checked on Linux", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels/cuda"

# The CUDA names the bodies use besides the threads': types and the
# rounding intrinsics (each op rounds once: compiled with no FMA contraction).
CUDA_NAMES = """
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
using std::min;
using std::max;
struct Dim3 { unsigned int x, y, z; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned int x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
struct __nv_bfloat16 { unsigned short v; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned int u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
static inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned int)b.v << 16); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.v; }
struct __half { _Float16 v; };
static inline __half __float2half_rn(float f) { return {(_Float16)f}; }
static inline float __half2float(__half h) { return (float)h.v; }
static inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h.v, 2); return u; }
static inline __half __ushort_as_half(unsigned short u) { __half h; std::memcpy(&h.v, &u, 2); return h; }
"""

# Threads that do not cooperate: one after another.
HOST_CUDA = CUDA_NAMES + """
static Dim3 blockIdx, blockDim, threadIdx;
"""


def host_kernel(body, params, template, grid, group):
    """`body` as a host function of `params` (C declarations), called for
    every thread of `grid` blocks of `group` threads; returns a ctypes
    function taking the same pointers."""
    if not shutil.which("g++"):
        pytest.skip("no C++ compiler")
    constants = "".join(f"constexpr int {k} = {v};\n" for k, v in template)
    names = ", ".join(p.rsplit(" ", 1)[1].lstrip("*") for p in params)
    extra = ", unsigned int grid" if grid == "grid" else ""  # then `run` takes the block count last
    source = (HOST_CUDA + "static void thread_body(" + ", ".join(params) + ") {\n" + constants + body
              + "\n}\nextern \"C\" void run(" + ", ".join(params) + extra + ") {\n"
              + f"  blockDim = Dim3{{{group}, 1, 1}};\n"
              + f"  for (unsigned int b = 0; b < {grid}; ++b) for (unsigned int t = 0; t < {group}; ++t) {{\n"
              + "    blockIdx = Dim3{b, 0, 0}; threadIdx = Dim3{t, 0, 0};\n"
              + f"    thread_body({names});\n  }}\n}}\n")
    scratch = Path(tempfile.mkdtemp(prefix="host-kernel-"))
    (scratch / "k.cpp").write_text(source)
    # No contraction into FMAs: each op rounds once, as __fmul_rn/__fadd_rn do.
    subprocess.run(["g++", "-O2", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared",
                    "-o", str(scratch / "k.so"), str(scratch / "k.cpp")], check=True)
    return ctypes.CDLL(str(scratch / "k.so")).run


def recurrence(state0, k, g, delta, n, hk, hv):
    """The replay as numpy float32: one rounding an op."""
    s = state0.copy()
    group = hv // hk
    for t in range(n):
        for h in range(hv):
            kt = k[0, t, h // group]                       # [DK]
            d = delta[0, t, h]                             # [DV]
            s[0, h] = s[0, h] * g[0, t, h]
            s[0, h] = s[0, h] + (d[:, None] * kt[None, :])  # each product rounded, then the sum
    return s


HK, HV, DK, DV, STEPS = 2, 4, 16, 8, 5
PARAMS = ["const float* state0", "const float* k", "const int* k_shape", "const float* g",
          "const float* delta", "const int32_t* n_steps", "float* state_out"]


def tape():
    rng = np.random.default_rng(7)
    return ((0.5 * rng.standard_normal((1, HV, DV, DK))).astype(np.float32),
            rng.standard_normal((1, STEPS, HK, DK)).astype(np.float32),
            rng.uniform(0.5, 1.0, (1, STEPS, HV)).astype(np.float32),
            rng.standard_normal((1, STEPS, HV, DV)).astype(np.float32))


def replayed(body, n, misaligned):
    """The replay body run on the host over `tape()` for n steps, its
    arrays 16-byte aligned or one float off."""
    state0, k, g, delta = tape()
    run = host_kernel(body, PARAMS, [("HK", HK), ("HV", HV), ("DK", DK), ("DV", DV)],
                      grid=HV * DV // 8, group=8)
    held = []

    def placed(a):
        flat = np.zeros(a.size + 8, np.float32)
        start = (-(flat.ctypes.data // 4)) % 4 + (1 if misaligned else 0)
        view = flat[start:start + a.size]
        view[:] = a.ravel()
        held.append(flat)
        return view

    arrays = [placed(a) for a in (state0, k, g, delta, np.zeros_like(state0))]
    shape = np.array(k.shape, np.int32)
    count = np.array([n], np.int32)
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    run(pointer(arrays[0]), pointer(arrays[1]), pointer(shape), pointer(arrays[2]), pointer(arrays[3]),
        pointer(count), pointer(arrays[4]))
    return arrays[4].reshape(state0.shape)


@pytest.mark.parametrize("misaligned", [False, True])
def test_the_replay_kernel_is_the_recurrence_bit_for_bit(misaligned):
    body = (KERNELS / "gdn_replay.cu").read_text()
    state0, k, g, delta = tape()
    for n in (0, 1, 3, STEPS, STEPS + 2):  # past the tape: clamped to its steps
        want = recurrence(state0, k, g, delta, min(n, STEPS), HK, HV)
        got = replayed(body, n, misaligned)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n, misaligned)


def test_a_replay_that_skips_the_decay_is_caught():
    # The check can fail: the body with its decay taken out of the float4
    # path differs from the recurrence.
    body = (KERNELS / "gdn_replay.cu").read_text()
    broken = body.replace("s[j + e] = __fmul_rn(s[j + e], g_t);", "")
    assert broken != body
    state0, k, g, delta = tape()
    want = recurrence(state0, k, g, delta, 3, HK, HV)
    assert not np.array_equal(replayed(broken, 3, False), want)


# Kernels whose threads do cooperate run too, one OS thread a CUDA thread:
# __shared__ arrays are the body's static locals, __syncthreads a barrier of
# the block, a shuffle an exchange through a warp's buffer between two
# barriers of the warp. Blocks run one after another.
HOST_CUDA_THREADS = CUDA_NAMES + """
#include <barrier>
#include <thread>
#include <vector>
static Dim3 blockIdx, blockDim;
static thread_local Dim3 threadIdx;
static std::barrier<>* block_barrier;
static std::vector<std::barrier<>*> warp_barriers;
static float warp_buffer[32][32];
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static inline void __syncwarp(unsigned int = 0xffffffffu) { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned int, float x, int offset) {
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  warp_buffer[warp][lane] = x;
  __syncwarp();
  const float y = warp_buffer[warp][lane ^ offset];
  __syncwarp();
  return y;
}
#define __shared__ static
"""


def host_block_kernel(body, params, template, blocks, threads):
    """`body` compiled as a host function of `params`, run for `blocks`
    blocks of `threads` threads (a multiple of 32), the threads of a block
    at once."""
    if not shutil.which("g++"):
        pytest.skip("no C++ compiler")
    constants = "".join(f"constexpr int {k} = {v};\n" for k, v in template)
    names = ", ".join(p.rsplit(" ", 1)[1].lstrip("*") for p in params)
    runtime_blocks = blocks == "grid"  # then `run` takes the block count last
    extra = ", unsigned int grid" if runtime_blocks else ""
    source = (HOST_CUDA_THREADS + "static void thread_body(" + ", ".join(params) + ") {\n" + constants + body
              + "\n}\nextern \"C\" void run(" + ", ".join(params) + extra + ") {\n"
              + f"  blockDim = Dim3{{{threads}, 1, 1}};\n"
              + f"  std::barrier<> block({threads});\n  block_barrier = &block;\n"
              + f"  std::vector<std::barrier<>*> warps;\n"
              + f"  for (int w = 0; w < {threads} / 32; ++w) warps.push_back(new std::barrier<>(32));\n"
              + "  warp_barriers = warps;\n"
              + f"  for (unsigned int b = 0; b < {blocks}; ++b) {{\n"
              + "    blockIdx = Dim3{b, 0, 0};\n    std::vector<std::thread> pool;\n"
              + f"    for (unsigned int t = 0; t < {threads}; ++t)\n"
              + f"      pool.emplace_back([=] {{ threadIdx = Dim3{{t, 0, 0}}; thread_body({names}); }});\n"
              + "    for (auto& th : pool) th.join();\n  }\n"
              + "  for (auto* w : warps) delete w;\n}\n")
    scratch = Path(tempfile.mkdtemp(prefix="host-kernel-"))
    (scratch / "k.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-std=c++20", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
                    "-o", str(scratch / "k.so"), str(scratch / "k.cpp")], check=True)
    return ctypes.CDLL(str(scratch / "k.so")).run


# The gated-delta layer at a small shape: 2 key heads, 4 value heads, 64 wide
# (two warps' worth of channels, so the block sums run over two groups).
L_HK, L_HV, L_DK, L_DV, L_K = 2, 4, 64, 64, 4
L_C = 2 * L_HK * L_DK + L_HV * L_DV


def layer_inputs(t, seed):
    rng = np.random.default_rng(seed)
    f = lambda *shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(np.float32)
    return [f(1, t, L_C), f(1, t, L_HV * L_DV), f(1, t, L_HV), f(1, t, L_HV), f(1, L_K - 1, L_C),
            f(L_C, L_K, scale=0.5), np.log(rng.uniform(1.0, 16.0, L_HV)).astype(np.float32),
            f(L_HV, scale=0.1), (1.0 + f(L_DV, scale=0.1)).astype(np.float32),
            np.array([1e-6, 1e-6, L_DK ** -1.0, L_DK ** -0.5], np.float32), f(1, L_HV, L_DV, L_DK, scale=0.1)]


def run_layer(split, ins):
    """gdn_layer.cu (f32 activations) on the host: its six outputs."""
    t = ins[0].shape[1]
    threads = (split * L_DV + 31) // 32 * 32
    names = ["qkv", "z", "b_in", "a_in", "conv_state", "conv_w", "a_log", "dt_bias", "norm_w", "consts",
             "state"]
    params = [f"const float* {n}" for n in names] + ["const int* qkv_shape"] + [
        f"float* {n}" for n in ("out", "state_out", "conv_out", "k_tape", "g_tape", "delta")]
    key = (split,)
    if key not in _layers:
        _layers[key] = host_block_kernel(
            (KERNELS / "gdn_layer.cu").read_text(), params,
            [("HK", L_HK), ("HV", L_HV), ("DK", L_DK), ("DV", L_DV), ("K", L_K), ("SPLIT", split),
             ("NT", threads), ("DT", 0), ("RA", 0), ("RN", 0)], L_HV, threads)
    outs = [np.zeros(s, np.float32) for s in ((1, t, L_HV * L_DV), (1, L_HV, L_DV, L_DK), (1, L_K - 1, L_C),
                                              (1, t, L_HK, L_DK), (1, t, L_HV), (1, t, L_HV, L_DV))]
    ins = [np.ascontiguousarray(a) for a in ins]
    shape = np.array(ins[0].shape, np.int32)
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    _layers[key](*[pointer(a) for a in ins], pointer(shape), *[pointer(a) for a in outs])
    return outs


_layers = {}


@pytest.mark.parametrize("split", [1, 4])
def test_the_layer_kernel_block_equals_its_steps(split):
    # 10 tokens: a tile of 8 and one of 2. What a verify computes for each
    # token equals what that token's decode step computes, bit for bit.
    t = 10
    ins = layer_inputs(t, 3)
    block = run_layer(split, ins)
    conv, state, rows = ins[4], ins[10], []
    for i in range(t):
        step = run_layer(split, [a[:, i:i + 1] for a in ins[:4]] + [conv] + ins[5:10] + [state])
        rows.append(step[0])
        conv, state = step[2], step[1]
    assert np.array_equal(block[0], np.concatenate(rows, axis=1))
    assert np.array_equal(block[1], state) and np.array_equal(block[2], conv)


def test_four_threads_a_row_compute_what_one_does():
    # Only the dot products' order differs: the conv state, the keys and
    # the decays are the same bits, the rest within float32 rounding.
    ins = layer_inputs(10, 5)
    one, four = run_layer(1, ins), run_layer(4, ins)
    for name, a, b in zip(("out", "state", "conv", "k_tape", "g_tape", "delta"), one, four):
        if name in ("conv", "k_tape", "g_tape"):
            assert np.array_equal(a, b), name
        else:
            assert np.allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(a).max()), name
    assert not np.array_equal(one[1], four[1])  # the order did change


def to_bf16(a):
    """float32 values rounded to bf16 (to nearest, ties to even): their bits."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


H_HQ, H_HKV, H_D, H_T = 4, 2, 64, 3


def run_head(gated, dims, q, k, v, qw, kw, offset, params):
    """attn_head.cu (bf16) on the host: q_out, k_out, v_out as bf16 bits."""
    b, t = q.shape[:2]
    if gated:  # each head's queries, then as many gate values (unread)
        gates = np.full_like(q.reshape(b, t, H_HQ, H_D), 0x3F80)
        qg = np.concatenate([q.reshape(b, t, H_HQ, H_D), gates], -1).reshape(b, t, -1)
    else:
        qg = q
    key = (gated, dims)
    if key not in _heads:
        params_c = ["const unsigned short* qg", "const int* qg_shape", "const unsigned short* k",
                    "const unsigned short* v", "const unsigned short* qw", "const unsigned short* kw",
                    "const int* offset", "const float* params", "unsigned short* q_out",
                    "unsigned short* k_out", "unsigned short* v_out"]
        _heads[key] = host_block_kernel(
            (KERNELS / "attn_head.cu").read_text(), params_c,
            [("D", H_D), ("HQ", H_HQ), ("HKV", H_HKV), ("DIMS", dims), ("DT", 1), ("GATED", gated)],
            b * t * (H_HQ + 2 * H_HKV), H_D)
    outs = [np.zeros((b, n, t, H_D), np.uint16) for n in (H_HQ, H_HKV, H_HKV)]
    arrays = [np.ascontiguousarray(a) for a in (qg, np.array(qg.shape, np.int32), k, v, qw, kw,
                                                np.array([offset], np.int32), params)]
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    _heads[key](*[pointer(a) for a in arrays], *[pointer(a) for a in outs])
    return outs


_heads = {}


def head_reference(x, w, dims, offset, base, scale, eps):
    """MLX's rms_norm then rope (not traditional) on `x` [B, T, H, D] (bf16
    values as float32), rounded as the kernel rounds: [B, H, T, D] floats."""
    n = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    y = from_bf16(to_bf16(from_bf16(to_bf16(x * n)) * w))
    half = dims // 2
    pos = (offset + np.arange(x.shape[1], dtype=np.float32))[None, :, None, None]
    inv = np.exp2(-(np.arange(half, dtype=np.float32) / half) * np.log2(base))
    theta = (scale * pos) * inv
    x1, x2 = y[..., :half], y[..., half:dims]
    out = y.copy()
    out[..., :half] = x1 * np.cos(theta) - x2 * np.sin(theta)
    out[..., half:dims] = x1 * np.sin(theta) + x2 * np.cos(theta)
    return from_bf16(to_bf16(out)).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dims", [H_D, 16])
def test_the_head_kernel_without_a_gate_reads_the_same_queries(dims):
    # A drafter's query product has no gate columns: the same queries, keys
    # and values come out as from a gated product, bit for bit, and they
    # are the norm and the rotation (within a bf16 step of numpy's).
    rng = np.random.default_rng(11)
    q = to_bf16(rng.standard_normal((1, H_T, H_HQ * H_D)))
    k = to_bf16(rng.standard_normal((1, H_T, H_HKV * H_D)))
    v = to_bf16(rng.standard_normal((1, H_T, H_HKV * H_D)))
    qw, kw = to_bf16(1 + 0.1 * rng.standard_normal(H_D)), to_bf16(1 + 0.1 * rng.standard_normal(H_D))
    base, scale, eps, offset = 1e6, 1.0, 1e-6, 37
    params = np.array([np.log2(base), scale, eps], np.float32)
    gated = run_head(1, dims, q, k, v, qw, kw, offset, params)
    plain = run_head(0, dims, q, k, v, qw, kw, offset, params)
    for a, b in zip(gated, plain):
        assert np.array_equal(a, b)
    want_q = head_reference(from_bf16(q).reshape(1, H_T, H_HQ, H_D), from_bf16(qw), dims, offset, base,
                            scale, eps)
    want_k = head_reference(from_bf16(k).reshape(1, H_T, H_HKV, H_D), from_bf16(kw), dims, offset, base,
                            scale, eps)
    assert np.allclose(from_bf16(plain[0]), want_q, atol=2e-2, rtol=1e-2)
    assert np.allclose(from_bf16(plain[1]), want_k, atol=2e-2, rtol=1e-2)
    assert np.array_equal(plain[2], v.reshape(1, H_T, H_HKV, H_D).transpose(0, 2, 1, 3))


# Attention for a few queries (attn_rows.cu, then attn_merge.cu), f32, causal.
A_HQ, A_GROUP, A_D = 4, 2, 64
A_CHUNK = 128


def run_attention(q, k, v, scale):
    """The two kernels on the host over q [1, HQ, T, D] and the whole cache
    k, v [1, HKV, L, D] (the T new positions last): out [1, T, HQ * D]."""
    t, length = q.shape[2], k.shape[2]
    nch = (length + A_CHUNK - 1) // A_CHUNK
    if "rows" not in _attention:
        _attention["rows"] = host_block_kernel(
            (KERNELS / "attn_rows.cu").read_text(),
            ["const float* q", "const int* q_shape", "const float* k", "const int* k_shape", "const float* v",
             "const float* scale", "float* part", "float* stats"],
            [("D", A_D), ("GROUP", A_GROUP), ("DT", 0), ("CAUSAL", 1)], "grid", 256)
        _attention["merge"] = host_block_kernel(
            (KERNELS / "attn_merge.cu").read_text(),
            ["const float* part", "const int* part_shape", "const float* stats", "float* out",
             "const float* gate"],
            [("D", A_D), ("DT", 0), ("GATE", 0)], "grid", A_D)
    part = np.zeros((1, A_HQ, t, nch, A_D), np.float32)
    stats = np.zeros((1, A_HQ, t, nch, 2), np.float32)
    out = np.zeros((1, t, A_HQ * A_D), np.float32)
    pointer = lambda a: np.ascontiguousarray(a).ctypes.data_as(ctypes.c_void_p)
    q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
    blocks = (A_HQ // A_GROUP) * nch * t
    _attention["rows"](pointer(q), pointer(np.array(q.shape, np.int32)), pointer(k),
                       pointer(np.array(k.shape, np.int32)), pointer(v), pointer(np.array([scale], np.float32)),
                       pointer(part), pointer(stats), blocks)
    _attention["merge"](pointer(part), pointer(np.array(part.shape, np.int32)), pointer(stats), pointer(out),
                        pointer(part), A_HQ * t)
    return out


_attention = {}


def test_attention_rows_do_not_depend_on_how_many_queries_come():
    # A verified block of 5 queries at the end of a 300-key cache (three
    # chunks): each query's output equals the one-query call at its
    # position (the cache as a decode step there sees it), bit for bit;
    # and it is the softmax attention numpy computes.
    rng = np.random.default_rng(2)
    t, length, scale = 5, 300, A_D ** -0.5
    q = rng.standard_normal((1, A_HQ, t, A_D)).astype(np.float32)
    k = rng.standard_normal((1, A_HQ // A_GROUP, length, A_D)).astype(np.float32)
    v = rng.standard_normal((1, A_HQ // A_GROUP, length, A_D)).astype(np.float32)
    block = run_attention(q, k, v, scale)
    for i in range(t):
        seen = length - t + i + 1
        alone = run_attention(q[:, :, i:i + 1], k[:, :, :seen], v[:, :, :seen], scale)
        assert np.array_equal(block[:, i], alone[:, 0]), i
    kk = np.repeat(k, A_GROUP, axis=1).astype(np.float64)
    vv = np.repeat(v, A_GROUP, axis=1).astype(np.float64)
    scores = np.einsum("bhtd,bhld->bhtl", q.astype(np.float64), kk) * scale
    positions = length - t + np.arange(t)
    scores[:, :, np.arange(length)[None, :] > positions[:, None]] = -np.inf
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhtl,bhld->bthd", p / p.sum(-1, keepdims=True), vv).reshape(1, t, -1)
    assert np.allclose(block, want, atol=1e-5)


@pytest.mark.parametrize("dt", [0, 1])
def test_the_conv_kernel_is_its_stated_sum_whatever_t(dt):
    # conv_rows.cu: each output the sum over j ascending of x[t + j] * w[j],
    # each product and sum rounded once in f32, then to the output type;
    # numpy's float32 in the same order gives the same bits, for a block of
    # 7 new positions and for each position alone.
    k, c = 4, 40
    rng = np.random.default_rng(9 + dt)
    x = rng.standard_normal((2, 7 + k - 1, c)).astype(np.float32)
    w = rng.standard_normal((c, k, 1)).astype(np.float32)
    store, back = (lambda a: a, lambda a: a) if dt == 0 else (to_bf16, from_bf16)
    x, w = back(store(x)), back(store(w))  # values the type can hold
    kind = "float" if dt == 0 else "unsigned short"
    run = host_kernel((KERNELS / "conv_rows.cu").read_text(),
                      [f"const {kind}* x", "const int* x_shape", f"const {kind}* w", f"{kind}* y"],
                      [("K", k), ("DT", dt)], grid="grid", group=32)

    def conv(xs):
        t = xs.shape[1] - k + 1
        y = np.zeros((xs.shape[0], t, c), np.float32 if dt == 0 else np.uint16)
        threads = xs.shape[0] * t * c
        args = [np.ascontiguousarray(store(xs)), np.array(xs.shape, np.int32),
                np.ascontiguousarray(store(w)), y]
        run(*[a.ctypes.data_as(ctypes.c_void_p) for a in args], (threads + 31) // 32)
        return back(y)

    want = np.zeros((2, 7, c), np.float32)
    for j in range(k):
        want = want + x[:, j:j + 7] * w[None, None, :, j, 0]
    want = back(store(want))
    block = conv(x)
    assert np.array_equal(block.view(np.uint32), want.view(np.uint32))
    for t in range(7):
        alone = conv(x[:, t:t + k])
        assert np.array_equal(alone[:, 0].view(np.uint32), block[:, t].view(np.uint32)), t
