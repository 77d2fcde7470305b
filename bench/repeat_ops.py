"""Whether MLX's own ops give the same bits twice at a long prefill's shapes
(docs/gpu.md, "Same prompt, same answer"): the 9B's 8,192-token prefill
did not always repeat, with or without our attention settings.

    python bench/repeat_ops.py [--tokens 8192] [--repeats 8]

Each op at the 9B's shapes (4-bit, group 64, bf16) runs REPEATS times on
the same inputs, each run evaluated alone, with a large array made and
dropped between runs so that MLX's allocator hands out other buffers. It
prints, per op, how many output elements differ from the first run's in
each later run. Run it with MLX_CUDA_USE_CUDNN_SDPA=0 too.
"""

import argparse

import mlx.core as mx


def quantized(k, n, key):
    w = mx.random.normal((n, k), key=key).astype(mx.bfloat16) * 0.02
    return mx.quantize(w, group_size=64, bits=4)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    t = args.tokens
    keys = iter(mx.random.split(mx.random.key(7), 32))
    x = mx.random.normal((1, t, 4096), key=next(keys)).astype(mx.bfloat16)
    h = mx.random.normal((1, t, 12288), key=next(keys)).astype(mx.bfloat16)
    ops = {}
    for name, (k, n) in {
        "qmm 4096->10240 (q/k/v)": (4096, 10240),
        "qmm 4096->24576 (gate/up)": (4096, 24576),
        "qmm 4096->4096 (o_proj)": (4096, 4096),
    }.items():
        w, s, b = quantized(k, n, next(keys))
        ops[name] = (lambda w=w, s=s, b=b: mx.quantized_matmul(x, w, s, b, True, 64, 4))
    w, s, b = quantized(12288, 4096, next(keys))
    ops["qmm 12288->4096 (down)"] = lambda: mx.quantized_matmul(h, w, s, b, True, 64, 4)
    q = mx.random.normal((1, 16, t, 256), key=next(keys)).astype(mx.bfloat16)
    kk = mx.random.normal((1, 4, t, 256), key=next(keys)).astype(mx.bfloat16)
    v = mx.random.normal((1, 4, t, 256), key=next(keys)).astype(mx.bfloat16)
    ops["sdpa causal 16/4 heads x 256"] = lambda: mx.fast.scaled_dot_product_attention(
        q, kk, v, scale=256**-0.5, mask="causal"
    )
    norm = mx.ones((4096,), mx.bfloat16)
    ops["rms_norm 4096"] = lambda: mx.fast.rms_norm(x, norm, 1e-6)
    ops["matmul bf16 4096x4096"] = lambda: x @ x[0, :4096, :].T
    mx.eval(x, h, q, kk, v)
    for name, op in ops.items():
        first = op()
        mx.eval(first)
        differing = []
        for i in range(1, args.repeats):
            junk = mx.random.normal((64 << 20,), key=mx.random.key(i)) * 3
            mx.eval(junk)
            del junk
            now = op()
            mx.eval(now)
            differing.append(int(mx.sum(first != now).item()))
        print(f"{name:32} elements differing from run 1: {differing}", flush=True)


if __name__ == "__main__":
    main()
