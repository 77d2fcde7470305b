"""What one operation costs the host on MLX's CUDA backend, by kind of
operation (docs/gpu.md, "What a call costs the host, by kind").

    python bench/host_cost.py [--calls 1000] [--repeats 5]

A decode step is bound by the host's time to build and queue its graph
(some 13 us an operation). This chains CALLS calls of one kind on a tiny
array (so the GPU's part is a few microseconds a kernel, none for a
view) and times, per call: building the lazy graph (the Python call and MLX's op), queueing it
(`mx.async_eval`: every primitive's `eval_gpu` and the CUDA graph's nodes)
and the whole until `mx.synchronize` returns. Kinds: MLX's own `add` and
`fast.rms_norm`, a `reshape` (a view), and `fast.cuda_kernel` calls of
one copy kernel whose source is tiny, or padded with a comment to 7 KB or
more (MLX copies a custom kernel's whole source into every call and
hashes it), with or without eight template values, and the 7 KB body by
`#include` of a file; and a kernel that also reads a one-value argument,
made from a host value on every call (as the attention's position and
length were, docs/gpu.md "One-value arguments made once") or the same
array every call. Medians over REPEATS chains.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx

# N, the array's size, is a constant: from the header or a template value.
BODY = """
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) { y[i] = x[i]; }
"""


def kernel(name, pad, templated, include=None):
    source = BODY
    if pad:
        source += "\n/*" + ("x" * 78 + "\n") * (pad // 79) + "*/\n"
    if include:
        # the body in a file of its own, MLX given a line that includes it
        # (docs/gpu.md, "Bodies by include")
        path = Path(include) / f"{name}.cuh"
        path.write_text(source)
        source = f'#include "{path}"\n'
    header = "" if templated else "constexpr int N = 1024;\n"
    return mx.fast.cuda_kernel(
        name=name, input_names=["x"], output_names=["y"], source=source, header=header
    )


def custom(name, pad, templated, include=None):
    k = kernel(name, pad, templated, include)
    template = [("N", 1024)] + [(f"T{i}", i) for i in range(7)] if templated else None

    def call(x):
        return k(
            inputs=[x],
            output_shapes=[x.shape],
            output_dtypes=[x.dtype],
            grid=(1024, 1, 1),
            threadgroup=(256, 1, 1),
            template=template,
        )[0]

    return call


SCALED = """
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 1024) { y[i] = x[i] * s[0]; }
"""


def with_scalar(fresh):
    """A copy kernel that reads a one-value argument: a new array from a
    host value each call (a small managed-memory buffer the host writes),
    or one array made once."""
    k = mx.fast.cuda_kernel(name="hc_scalar", input_names=["x", "s"], output_names=["y"], source=SCALED)
    once = mx.array([1.0], mx.float32)

    def call(x):
        s = mx.array([1.0], mx.float32) if fresh else once
        return k(inputs=[x, s], output_shapes=[x.shape], output_dtypes=[x.dtype],
                 grid=(1024, 1, 1), threadgroup=(256, 1, 1))[0]

    return call


def chain(op, x, calls):
    start = time.perf_counter()
    y = x
    for _ in range(calls):
        y = op(y)
    built = time.perf_counter()
    mx.async_eval(y)
    queued = time.perf_counter()
    mx.synchronize()
    done = time.perf_counter()
    return built - start, queued - built, done - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pad", type=int, default=24000, help="bytes of padded source")
    args = parser.parse_args()
    x = mx.ones((1024,), mx.float32)
    w = mx.ones((1024,), mx.float32)
    bodies = tempfile.mkdtemp(prefix="host-cost-")
    kinds = {
        "mlx add": lambda y: y + 1.0,
        "mlx fast.rms_norm": lambda y: mx.fast.rms_norm(y, w, 1e-6),
        "mlx reshape (a view, no kernel)": lambda y: y.reshape(
            (1024,) if y.ndim == 2 else (32, 32)
        ),
        "cuda_kernel, tiny source": custom("hc_tiny", 0, False),
        "cuda_kernel, source 7 KB": custom("hc_pad7", 7000, False),
        f"cuda_kernel, source {args.pad} B": custom("hc_pad", args.pad, False),
        "cuda_kernel, tiny source, 8 template values": custom("hc_tmpl", 0, True),
        "cuda_kernel, source 7 KB, 8 template values": custom("hc_both", 7000, True),
        "cuda_kernel, source 7 KB by #include": custom("hc_incl", 7000, False, bodies),
        "cuda_kernel + a one-value array made each call": with_scalar(True),
        "cuda_kernel + the same one-value array each call": with_scalar(False),
    }
    rows = []
    for name, op in kinds.items():
        chain(op, x, 10)  # compile and warm up
        chain(op, x, args.calls)
        runs = [chain(op, x, args.calls) for _ in range(args.repeats)]
        build, queue, total = (
            statistics.median(r[i] for r in runs) / args.calls * 1e6 for i in range(3)
        )
        rows.append({"kind": name, "build_us": build, "queue_us": queue, "total_us": total})
        print(f"{name:52s} build {build:6.2f} us  queue {queue:6.2f} us  total {total:6.2f} us")
    print(json.dumps({"calls": args.calls, "repeats": args.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
