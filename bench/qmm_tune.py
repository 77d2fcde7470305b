"""Choose the quantized matmul's launch shapes on the GPU: every (NT, warps)
of `kernels/cuda/qmm.cu` timed against MLX's `quantized_matmul` at the
9B and 35B-A3B layer shapes, with the rows-vs-one-row check on each launch
(docs/gpu.md, "The quantized matmul").

    python3 bench/qmm_tune.py [--old FILE] [--json OUT]

`--old` times another body beside it at the rule's launch and says whether
its products equal this body's bit for bit (a change meant to keep every
sum, e.g. `git show HEAD:kernels/cuda/qmm.cu > /tmp/qmm_old.cu`).
`--dependent` also times every launch in a chain of dependent calls (each
waits for the one before, as a model's layers do): the launch that wins
there is the one a decode step wants.
Measured chained, as `bench/gpu_kernels.py` does: 64 calls in one evaluation
over 8 weight copies (2 for the lm_heads), so neither the ~60 us of one
evaluation nor the 50 MB L2 is counted. One JSON line per shape and M,
with the launch `row_invariant::qmm_launch` picks (as `bench/gpu_kernels.py`
mirrors it) beside the best one.

It also prints the floor of one call: the same body returning at its first
line, and MLX's quantized_matmul of a 64 x 64 weight, chained like the rest;
a layer whose time is near the floor is bound by the cost of a call (the
host's, in MLX's graph building), not by its kernel.
"""

import argparse
import faulthandler
import json
import time
from pathlib import Path

import mlx.core as mx

from gpu_kernels import launch_qmm

ROOT = Path(__file__).resolve().parent.parent
START = time.perf_counter()
# Eight tiles are not in the engine's rule (row_invariant::qmm_launch): tried
# here for the M = 16 products, where four tiles read twice as many bytes of
# x as of weights (docs/gpu.md, "Weight loads ahead of the products").
# Blocks of at most 8 warps: the body now needs more than 128 registers a
# thread at some template values, so a 16-warp block (512 threads) fails to
# launch ("too many resources requested", an H100, 2026-12-07); the engine's
# rule never asks for more than 8.
LAUNCHES = [(nt, w) for nt in (1, 2, 4, 8) for w in (1, 2, 4, 8)]


def max_warps(nt: int, mt: int) -> int:
    """The body's MAX_WARPS (kernels/cuda/qmm.cu): its shared memory holds
    this many warps' partial sums."""
    return (4 if mt == 2 else 8) if nt == 8 else 8 if nt == 4 else 16

# (model, layer, in, out)
SHAPES = [
    ("9B", "attn q_proj / gdn qkv", 4096, 8192), ("9B", "attn kv_proj", 4096, 1024), ("9B", "o_proj / gdn z / out", 4096, 4096),
    ("9B", "mlp gate/up", 4096, 12288), ("9B", "mlp down", 12288, 4096), ("9B", "lm_head", 4096, 248320),
    ("35B-A3B", "attn q_proj", 2048, 8192), ("35B-A3B", "attn o_proj", 4096, 2048),
    ("35B-A3B", "expert gate/up", 2048, 512), ("35B-A3B", "lm_head", 2048, 248320),
    ("9B", "gdn b / a", 4096, 32),
    # The 9B's maps as the engine stacks them (docs/gpu.md, "Fewer calls"):
    # a gated-delta layer's qkv, z, b and a; an attention's q (with its
    # gate), k and v; the MLP's gate and up (paired for the GLU end).
    ("9B", "gdn in_proj stacked", 4096, 8192 + 4096 + 32 + 32), ("9B", "attn q/k/v stacked", 4096, 8192 + 1024 + 1024),
    ("9B", "mlp gate/up paired", 4096, 24576),
]


def out(**row):
    row["at_s"] = round(time.perf_counter() - START, 1)
    print(json.dumps(row), flush=True)
    return row


_kernels = {}


def body_kernel(name, source):
    if name not in _kernels:
        inputs = ["x", "w", "scales", "biases", "res", "pairs"]
        _kernels[name] = mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=["y"], source=source)
    return _kernels[name]


def qmm(source, name, x, w, scales, biases, bits, nt, warps):
    m, k = x.shape
    n = w.shape[0]
    # No fused ends (GLU = RES = GATHER = 0): x stands in for the unread residual and pairs.
    template = [("BITS", bits), ("HALF", int(x.dtype == mx.float16)), ("NT", nt), ("MT", 1 if m <= 16 else 2),
                ("GLU", 0), ("RES", 0), ("GATHER", 0), ("P1", 0), ("P2", 0), ("P3", 0)]
    blocks = -(-n // (8 * nt))
    # Bodies since 2026-12-06 read a dense call's x as [B, T, K]; earlier ones (--old) as [M, K].
    if "x_shape[GATHER ? 1 : 2]" in source:
        x = x[None]
    return body_kernel(name, source)(inputs=[x, w, scales, biases, x, x], template=template,
                                     grid=(blocks * 32 * warps, 1, 1), threadgroup=(32 * warps, 1, 1),
                                     output_shapes=[(m, n)], output_dtypes=[x.dtype])[0]


def chained(make, reps=5, calls=64):
    mx.eval(make())
    mx.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        mx.eval(make())
    mx.synchronize()
    return (time.perf_counter() - start) / reps / calls


def dependent(call, xs):
    """64 calls in one evaluation, each waiting for the one before (its input
    takes a zero times the previous output), as a model's layers do: each
    call's whole latency counts. Independent calls may overlap on the GPU."""
    def make():
        y, outs = None, []
        for i, x in enumerate(xs):
            y = call(i, x if y is None else x + 0 * y[:, :1])
            outs.append(y)
        return outs
    return make


def rows_differ(call, x, ms):
    """How many rows of M-row calls differ from their 1-row products."""
    singles = mx.concatenate([call(x[i:i + 1]) for i in range(x.shape[0])])
    bad = {}
    for m in ms:
        d = int(mx.sum(mx.any(call(x[:m]) != singles[:m], axis=-1)).item())
        if d:
            bad[m] = d
    return bad, singles


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", help="an earlier qmm.cu body to time beside")
    parser.add_argument("--json", help="write every row here too")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes only")
    parser.add_argument("--only", type=int, nargs="*", help="these shape indices only")
    parser.add_argument("--dependent", action="store_true",
                        help="also time chains of dependent calls (latency, as in a decode step)")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(60, repeat=True)
    new = (ROOT / "kernels/cuda/qmm.cu").read_text()
    old = Path(args.old).read_text() if args.old else None
    rows = [out(device=str(mx.default_device()), mlx=mx.__version__)]
    bits, gs = args.bits, 64
    big = [mx.zeros((1 << 26,), dtype=mx.float32) + i for i in range(4)]
    mx.eval(big)
    t = chained(lambda: [big[i % 4] * 1.0001 for i in range(64)])
    copy_gbps = 2 * big[0].nbytes / t / 1e9
    rows.append(out(what="elementwise 256 MiB read + write, chained", GBps=round(copy_gbps, 1)))
    del big
    # The floor of one call.
    wq, sc, bi = mx.quantize(mx.zeros((64, 64), dtype=mx.bfloat16), group_size=gs, bits=bits)
    x1 = mx.zeros((1, 64), dtype=mx.bfloat16)
    t_mlx = chained(lambda: [mx.quantized_matmul(x1 + i, wq, sc, bi, transpose=True, group_size=gs, bits=bits)
                             for i in range(64)])
    t_add = chained(lambda: [x1 + i for i in range(64)])
    empty = "if (threadIdx.x < 100000) return;\n" + new
    t_empty = chained(lambda: [qmm(empty, "tune_qmm_empty", x1 + i, wq, sc, bi, bits, 1, 1) for i in range(64)])
    rows.append(out(what="floor of one call, chained (us)", mlx_qmm_64x64=round((t_mlx - t_add) * 1e6, 2),
                    our_body_returning_at_once=round((t_empty - t_add) * 1e6, 2), one_add=round(t_add * 1e6, 2)))
    for seed, (model, layer, k, n) in enumerate(SHAPES):
        if (seed not in args.only) if args.only else seed >= args.shapes:
            continue
        chunks = -(-k // (4 * (128 // bits)))
        launches = [(nt, w) for nt, w in LAUNCHES if w <= max(1, chunks)]
        copies = []
        for c in range(2 if n > 100_000 else 8):
            w = (mx.random.normal((n, k), key=mx.random.key(100 * seed + c)) * 0.02).astype(mx.bfloat16)
            copies.append(mx.quantize(w, group_size=gs, bits=bits))
            mx.eval(*copies[-1])
        nbytes = sum(a.nbytes for a in copies[0])
        # Exactness of every launch on one copy: rows vs 1-row products, and vs MLX.
        x = mx.random.normal((32, k), key=mx.random.key(7 + seed)).astype(mx.bfloat16)
        ref = mx.quantized_matmul(x, *copies[0], transpose=True, group_size=gs, bits=bits).astype(mx.float32)
        scale = float(mx.abs(ref).max().item())
        exact = {}
        worst_rel = 0.0
        for nt, warps in launches:
            # M = 17..32 (a second row tile, another compiled variant) on one launch per NT.
            ms = (2, 16, 17, 32) if warps in (4, 8) and warps <= max_warps(nt, 2) else (2, 16)
            bad, singles = rows_differ(lambda xx: qmm(new, "tune_qmm", xx, *copies[0], bits, nt, warps), x, ms)
            if bad:
                exact[f"nt{nt}_w{warps}"] = bad
            worst_rel = max(worst_rel, float(mx.abs(singles.astype(mx.float32) - ref).max().item()) / scale)
        same_as_old = None
        if old:
            nt, warps = launch_qmm(n, k, bits)
            new_y = qmm(new, "tune_qmm", x, *copies[0], bits, nt, warps)
            old_y = qmm(old, "tune_qmm_old", x, *copies[0], bits, nt, warps)
            same_as_old = bool(mx.all(new_y == old_y).item())
        rows.append(out(check="rows", model=model, layer=layer, k=k, n=n, bits=bits,
                        launches_with_rows_differing=exact, worst_rel_diff_vs_mlx=round(worst_rel, 5),
                        old_body_bit_identical=same_as_old, ok=not exact and worst_rel < 2e-2))
        for m in (1, 16):
            xs = [mx.random.normal((m, k), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(64)]
            mx.eval(xs)
            c = lambda i: copies[i % len(copies)]
            t_mlx = chained(lambda: [mx.quantized_matmul(xs[i], *c(i), transpose=True, group_size=gs, bits=bits)
                                     for i in range(64)])
            row = dict(speed="qmm", model=model, layer=layer, k=k, n=n, M=m, MB=round(nbytes / 1e6, 2),
                       mlx_us=round(t_mlx * 1e6, 2), mlx_GBps=round(nbytes / t_mlx / 1e9))
            if old:
                nt, warps = launch_qmm(n, k, bits)
                t_old = chained(lambda: [qmm(old, "tune_qmm_old", xs[i], *c(i), bits, nt, warps) for i in range(64)])
                row["old_us"] = round(t_old * 1e6, 2)
            best = None
            times = {}
            for nt, warps in launches:
                tn = chained(lambda: [qmm(new, "tune_qmm", xs[i], *c(i), bits, nt, warps) for i in range(64)])
                times[f"nt{nt}_w{warps}"] = round(tn * 1e6, 2)
                if best is None or tn < best[0]:
                    best = (tn, nt, warps)
            nt, warps = launch_qmm(n, k, bits)
            t_rule = chained(lambda: [qmm(new, "tune_qmm", xs[i], *c(i), bits, nt, warps) for i in range(64)])
            row.update(rule_launch=f"nt{nt}_w{warps}", rule_us=round(t_rule * 1e6, 2),
                       rule_GBps=round(nbytes / t_rule / 1e9), rule_vs_mlx=round(t_mlx / t_rule, 2),
                       rule_pct_copy=round(100 * nbytes / t_rule / 1e9 / copy_gbps, 1))
            if args.dependent:
                t_floor = chained(dependent(lambda i, x: x[:, :1] * 1, xs))
                t_dep = lambda call: round((chained(dependent(call, xs)) - t_floor) * 1e6, 2)
                row.update(dependent_floor_us=round(t_floor * 1e6, 2), dependent_mlx_us=t_dep(
                    lambda i, x: mx.quantized_matmul(x, *c(i), transpose=True, group_size=gs, bits=bits)))
                if old:
                    row["dependent_old_us"] = t_dep(lambda i, x: qmm(old, "tune_qmm_old", x, *c(i), bits, nt, warps))
                dep = {}
                for lt, lw in launches:
                    dep[f"nt{lt}_w{lw}"] = t_dep(lambda i, x: qmm(new, "tune_qmm", x, *c(i), bits, lt, lw))
                best_dep = min(dep, key=dep.get)
                row.update(dependent_rule_us=dep.get(f"nt{nt}_w{warps}"), dependent_best=best_dep,
                           dependent_best_us=dep[best_dep],
                           dependent_best_vs_mlx=round(row["dependent_mlx_us"] / max(dep[best_dep], 0.01), 2),
                           dependent_us=dep)
            row.update(best_launch=f"nt{best[1]}_w{best[2]}", best_us=round(best[0] * 1e6, 2),
                       best_GBps=round(nbytes / best[0] / 1e9), best_vs_mlx=round(t_mlx / best[0], 2),
                       best_pct_copy=round(100 * nbytes / best[0] / 1e9 / copy_gbps, 1), times_us=times)
            rows.append(out(**row))
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
