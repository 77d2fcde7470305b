"""A CUDA kernel body whose threads do not cooperate (no shared memory, no
barriers, no shuffles) runs on the host too: compiled by the system's C++
compiler with the few CUDA names it uses defined, its function called for
every (block, thread) in turn. Then its values can be checked here, on a
machine without a GPU, against the arithmetic it claims.

`kernels/cuda/gdn_replay.cu` (a rollback's replay of a gated-delta tape):
its result must equal the recurrence s = s * g; s = s + k * delta, each op
rounded once (numpy's float32 arithmetic), bit for bit, on the float4 path
(aligned arrays) and on the scalar one (arrays one float off alignment).
"""

import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels/cuda"

HOST_CUDA = """
#include <cstddef>
#include <cstdint>
struct Dim3 { unsigned int x, y, z; };
static Dim3 blockIdx, blockDim, threadIdx;
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
"""


def host_kernel(body, params, template, grid, group):
    """`body` as a host function of `params` (C declarations), called for
    every thread of `grid` blocks of `group` threads; returns a ctypes
    function taking the same pointers."""
    if not shutil.which("g++"):
        pytest.skip("no C++ compiler")
    constants = "".join(f"constexpr int {k} = {v};\n" for k, v in template)
    names = ", ".join(p.rsplit(" ", 1)[1].lstrip("*") for p in params)
    source = (HOST_CUDA + "static void thread_body(" + ", ".join(params) + ") {\n" + constants + body
              + "\n}\nextern \"C\" void run(" + ", ".join(params) + ") {\n"
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
