"""Our CUDA kernel bodies (kernels/cuda/*.cu) compile, on a machine without a
GPU: each is wrapped the way MLX's `fast::cuda_kernel` wraps it (a
`__global__` function whose parameters come from the input and output names,
an `<input>_shape` parameter for each such name in the body, the template
arguments as `constexpr int`s) and compiled with NVRTC for sm_90 (the H200)
down to machine code, so inline PTX is checked too. A compile error found
here costs seconds; found on the GPU machine it costs device time.

The template arguments are the ones the Rust side passes
(flashbar_mlx::row_invariant, flashbar_mlx::gdn_kernels), every combination
a model can ask for.
"""

import ctypes
import itertools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels/cuda"

if sys.platform != "linux":
    pytest.skip("NVRTC's wheel (tests/python/requirements.txt) is Linux-only", allow_module_level=True)

import nvidia  # noqa: E402  (the nvidia-cuda-nvrtc and -runtime wheels)

CU13 = Path(list(nvidia.__path__)[0]) / "cu13"

PREAMBLE = """
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
typedef int int32_t;
struct Shape { int v[8]; __device__ int operator[](int i) const { return v[i]; } };
"""
CTYPES = {"f32": "float", "bf16": "__nv_bfloat16", "f16": "__half", "u32": "uint32_t", "i32": "int32_t"}


def nvrtc():
    # libnvrtc loads its builtins library by name, from the same folder.
    ctypes.CDLL(str(CU13 / "lib/libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(str(CU13 / "lib/libnvrtc.so.13"))


def compact(source: str) -> str:
    """The body as the Rust launcher hands it to MLX
    (`custom_kernel::Body::compact_source`): `//` comments outside string
    literals, indentation and blank lines dropped."""
    lines = []
    for line in source.splitlines():
        at = line.find("//")
        if at >= 0 and line[:at].count('"') % 2 == 0:
            line = line[:at]
        if line.strip():
            lines.append(line.strip())
    return "".join(line + "\n" for line in lines)


def wrap(body: str, inputs, outputs, template) -> str:
    body = compact(body)
    params = []
    for name, dtype in inputs:
        params.append(f"const {CTYPES[dtype]}* {name}")
        if f"{name}_shape" in body:
            params.append(f"const __grid_constant__ Shape {name}_shape")
        assert f"{name}_strides" not in body and f"{name}_ndim" not in body, name
    params += [f"{CTYPES[dtype]}* {name}" for name, dtype in outputs]
    constants = "".join(f"  constexpr int {key} = {value};\n" for key, value in template)
    return (PREAMBLE + "namespace mlx::core::cu {\n__global__ void kernel(" + ", ".join(params) + ") {\n"
            + constants + body + "\n}\n}\n")


def compile_log(lib, source: str, options) -> tuple[int, str]:
    """NVRTC's status and log for `source` compiled to sm_90 machine code."""
    program = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None) == 0
    options = [f"-I{CU13 / 'include'}".encode(), b"--gpu-architecture=sm_90", b"-std=c++17", *options]
    status = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    lib.nvrtcDestroyProgram(ctypes.byref(program))
    return status, log.value.decode(errors="replace").strip()


def compile_ok(lib, source: str) -> str:
    """'' when NVRTC compiles `source` to sm_90 machine code, else its log."""
    status, text = compile_log(lib, source, [])
    return "" if status == 0 and not text else f"status {status}: {text}"


def variants():
    qmm = (KERNELS / "qmm.cu").read_text()
    for bits, half, tiles, row_tiles, glu, res, gather in itertools.product(
            (4, 8), (0, 1), (1, 2, 4), (1, 2, 4), (0, 1), (0, 1), (0, 1)):
        if glu and tiles != 4:
            continue  # the GLU end pairs tiles 0-1 with 2-3: four tiles only
        if gather and res:
            continue  # the experts take no residual (their GLU end: a MoE block's gate/up)
        t = "f16" if half else "bf16"
        # Without GATHER the launcher passes x for the unread pairs.
        pairs = "i32" if gather else t
        yield (f"qmm bits={bits} half={half} NT={tiles} MT={row_tiles} GLU={glu} RES={res} GATHER={gather}",
               qmm, [("x", t), ("w", "u32"), ("scales", t), ("biases", t), ("res", t), ("pairs", pairs)],
               [("y", t)],
               [("BITS", bits), ("HALF", half), ("NT", tiles), ("MT", row_tiles), ("GLU", glu),
                ("RES", res), ("GATHER", gather), ("P1", 0), ("P2", 0), ("P3", 0)])
    # Split ends (parts apart): the 9B's gated-delta input maps and its attention's q/k/v.
    for bits, parts in itertools.product((4, 8), ((8192, 12288, 12320), (8192, 9216, 0))):
        t = "bf16"
        yield (f"qmm bits={bits} split={parts}", qmm,
               [("x", t), ("w", "u32"), ("scales", t), ("biases", t), ("res", t), ("pairs", t)],
               [("y", t)],
               [("BITS", bits), ("HALF", 0), ("NT", 4), ("MT", 1), ("GLU", 0), ("RES", 0),
                ("GATHER", 0), ("P1", parts[0]), ("P2", parts[1]), ("P3", parts[2])])
    attn = (KERNELS / "attn_rows.cu").read_text()
    merge = (KERNELS / "attn_merge.cu").read_text()
    # Head dims 32..256 (a lane's share of a key: 1, 2, 4 or 8 elements);
    # the embedded target's 3 query heads a KV head, the 9B's 4, the
    # 35B-A3B's 8, 16 (32 heads over 2).
    for dim, dt, causal, group in itertools.product((32, 64, 128, 256), (0, 1, 2), (0, 1), (3, 4, 8, 16)):
        t = ("f32", "bf16", "f16")[dt]
        yield (f"attn_rows D={dim} DT={dt} CAUSAL={causal} GROUP={group}", attn,
               [("q", t), ("k", t), ("v", t), ("scale", "f32")], [("part", "f32"), ("stats", "f32")],
               [("D", dim), ("GROUP", group), ("DT", dt), ("CAUSAL", causal)])
    # The cache in buffers with room (row_invariant's ATTN_ROOM: the body after a define).
    for dim, dt in itertools.product((128, 256), (1, 2)):
        t = ("f32", "bf16", "f16")[dt]
        yield (f"attn_rows KV_ROOM D={dim} DT={dt}", "#define KV_ROOM 1\n" + attn,
               [("q", t), ("k", t), ("v", t), ("scale", "f32"), ("length", "i32")],
               [("part", "f32"), ("stats", "f32")],
               [("D", dim), ("GROUP", 4), ("DT", dt), ("CAUSAL", 1)])
    # Without the output gate the launcher passes `part` for the unread gate.
    for dim, dt, gate in itertools.product((32, 64, 128, 256), (0, 1, 2), (0, 1)):
        t = ("f32", "bf16", "f16")[dt]
        if gate and dt == 0:
            continue
        yield (f"attn_merge D={dim} DT={dt} GATE={gate}", merge,
               [("part", "f32"), ("stats", "f32"), ("gate", t if gate else "f32")], [("out", t)],
               [("D", dim), ("DT", dt), ("GATE", gate)])
    head = (KERNELS / "attn_head.cu").read_text()
    # The 9B's attention head, the 35B-A3B's, the embedded target's; bf16 and f16;
    # gated (the targets') and not (a drafter's: all of a head's dims rotate).
    for (hq, hkv, dim, dims), dt, gated in itertools.product(
            ((16, 4, 256, 64), (16, 2, 256, 64), (6, 2, 64, 16), (32, 8, 128, 128)), (1, 2), (1, 0)):
        t = ("f32", "bf16", "f16")[dt]
        yield (f"attn_head HQ={hq} HKV={hkv} D={dim} DT={dt} GATED={gated}", head,
               [("qg", t), ("k", t), ("v", t), ("qw", t), ("kw", t), ("offset", "i32"), ("params", "f32")],
               [("q_out", t), ("k_out", t), ("v_out", t)],
               [("D", dim), ("HQ", hq), ("HKV", hkv), ("DIMS", dims), ("DT", dt), ("GATED", gated)])
    route = (KERNELS / "moe_route.cu").read_text()
    combine = (KERNELS / "moe_combine.cu").read_text()
    # The 35B-A3B's 256 experts, 8 a token; the fixtures' 8, 2; a 512-expert, 10-a-token shape.
    # SHARED: the shared expert among the experts (docs/gpu.md, "The shared expert among the experts").
    for (experts, k), norm, half, shared in itertools.product(((256, 8), (32, 2), (512, 10)), (0, 1),
                                                              (0, 1), (0, 1)):
        t = "f16" if half else "bf16"
        yield (f"moe_route E={experts} K={k} NORM={norm} HALF={half} SHARED={shared}", route,
               [("logits", t)], [("pairs_in", "i32"), ("pairs_out", "i32"), ("scores", t)],
               [("E", experts), ("K", k), ("NORM", norm), ("HALF", half), ("SHARED", shared)])
    for k, res, half, shared in itertools.product((2, 8, 10), (0, 1), (0, 1), (0, 1)):
        t = "f16" if half else "bf16"
        yield (f"moe_combine K={k} RES={res} HALF={half} SHARED={shared}", combine,
               [(n, t) for n in ("down", "scores", "shared", "gate", "res")], [("y", t)],
               [("K", k), ("GCOL", 256), ("RES", res), ("HALF", half), ("SHARED", shared)])
        # row_invariant's COMBINE_NORM: the body after a define, the next norm written too.
        yield (f"moe_combine NORM_OUT K={k} RES={res} HALF={half} SHARED={shared}",
               "#define NORM_OUT 1\n" + combine,
               [(n, t) for n in ("down", "scores", "shared", "gate", "res", "nw")] + [("eps", "f32")],
               [("y", t), ("normed", t)],
               [("K", k), ("GCOL", 256), ("RES", res), ("HALF", half), ("SHARED", shared)])
    conv = (KERNELS / "conv_rows.cu").read_text()
    for dt in (0, 1, 2):
        t = ("f32", "bf16", "f16")[dt]
        yield (f"conv_rows DT={dt}", conv, [("x", t), ("w", t)], [("y", t)], [("K", 4), ("DT", dt)])
    gdn = [("HK", 4), ("HV", 8), ("DK", 64), ("DV", 64)]
    yield ("gdn_record", (KERNELS / "gdn_record.cu").read_text(),
           [(n, "f32") for n in ("q", "k", "v", "g", "beta", "state")],
           [("y", "f32"), ("state_out", "f32"), ("delta", "f32")], gdn)
    yield ("gdn_replay", (KERNELS / "gdn_replay.cu").read_text(),
           [("state0", "f32"), ("k", "f32"), ("g", "f32"), ("delta", "f32"), ("n_steps", "i32")],
           [("state_out", "f32")], gdn)
    for name in ("gdn_layer",):
        yield from gdn_layer_variants(name)


def gdn_layer_variants(name):
    layer = (KERNELS / f"{name}.cu").read_text()
    # The embedded target's heads and the 9B's; activations f32 / bf16 / f16,
    # with dt_bias and the norm weight of the same type or f32.
    # A state row over one thread or four (gdn_kernels::layer's SPLIT).
    for (hk, hv, dk, dv), dt, mixed, split in itertools.product(
            ((4, 8, 64, 64), (16, 32, 128, 128)), (0, 1, 2), (0, 1), (1, 4)):
        t = ("f32", "bf16", "f16")[dt]
        rounded = 0 if mixed else dt
        yield (f"{name} HK={hk} DV={dv} DT={dt} mixed={mixed} SPLIT={split}", layer,
               [("qkv", t), ("z", t), ("b_in", t), ("a_in", t), ("conv_state", t)]
               + [(n, "f32") for n in ("conv_w", "a_log", "dt_bias", "norm_w", "consts", "state")],
               [("out", t), ("state_out", "f32"), ("conv_out", t), ("k_tape", "f32"),
                ("g_tape", "f32"), ("delta", "f32")],
               [("HK", hk), ("HV", hv), ("DK", dk), ("DV", dv), ("K", 4), ("SPLIT", split),
                ("NT", (split * dv + 31) // 32 * 32), ("DT", dt), ("RA", rounded), ("RN", rounded)])


def test_every_cuda_kernel_body_compiles_for_the_h200():
    lib = nvrtc()
    failures = {}
    for label, body, inputs, outputs, template in variants():
        log = compile_ok(lib, wrap(body, inputs, outputs, template))
        if log:
            failures[label] = log[:2000]
    assert not failures, failures


def test_the_quantized_matmul_keeps_to_its_registers():
    # ptxas's report for every qmm variant: a spill to local memory in the
    # products' loop costs a decode step more than the variant saves, and
    # the prefill's 64-row tiles (MT = 4) sit near the 255-register limit
    # (docs/gpu.md, "64-row tiles").
    lib = nvrtc()
    spills = {}
    for label, body, inputs, outputs, template in variants():
        if not label.startswith("qmm"):
            continue
        status, log = compile_log(lib, wrap(body, inputs, outputs, template), [b"--ptxas-options=-v"])
        assert status == 0, (label, log[:2000])
        stores = re.search(r"(\d+) bytes spill stores", log)
        assert stores, (label, log[:2000])
        if int(stores.group(1)):
            spills[label] = stores.group(0)
    assert not spills, spills


def test_a_split_gated_delta_layer_fits_its_block():
    # With a state row over four threads a block is 4 DV threads (512 at the
    # 9B's heads): a launch of 512 needs at most 128 registers a thread, and
    # the state (a quarter row a thread) should stay out of local memory.
    lib = nvrtc()
    for label, body, inputs, outputs, template in gdn_layer_variants("gdn_layer"):
        if "SPLIT=4" not in label:
            continue
        status, log = compile_log(lib, wrap(body, inputs, outputs, template), [b"--ptxas-options=-v"])
        assert status == 0, (label, log[:2000])
        registers = re.search(r"Used (\d+) registers", log)
        stores = re.search(r"(\d+) bytes spill stores", log)
        assert registers and stores, (label, log[:2000])
        threads = dict(template)["NT"]
        assert int(registers.group(1)) * threads <= 65536, (label, registers.group(0), threads)
        assert int(stores.group(1)) == 0, (label, stores.group(0))


def test_a_broken_body_is_reported():
    # The check can fail: an undefined name is a compile error, with a log.
    log = compile_ok(nvrtc(), wrap("y[0] = undefined_name;", [], [("y", "f32")], []))
    assert "undefined_name" in log


def test_the_python_launch_rule_is_the_rust_one():
    """bench/gpu_kernels.py's `launch_qmm` (which bench/qmm_tune.py uses too)
    mirrors `row_invariant::qmm_launch`: every case the Rust test pins gives
    the same (NT, warps) here, so the GPU checks run the launches the engine
    runs."""
    import re

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_kernels import launch_qmm

    rust = (ROOT / "crates/flashbar-mlx/src/row_invariant/qmm.rs").read_text()
    cases = re.findall(r"assert_eq!\(qmm_launch\(([\d_]+), (\d+), (\d+)\), \((\d+), (\d+)\)\);", rust)
    assert len(cases) >= 8, "the Rust launch table moved: update this pattern"
    for n, k, bits, tiles, warps in cases:
        got = launch_qmm(int(n.replace("_", "")), int(k), int(bits))
        assert got == (int(tiles), int(warps)), (n, k, bits, got)
