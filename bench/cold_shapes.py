"""What a new sequence length costs the first time on this device.

    python3 bench/cold_shapes.py

A DFlash round attends a block of 16 queries over a context one round longer
than the last, so every round of a new answer meets attention shapes not
seen before, while a decode step (1 query) does not care. This times MLX's
attention for 1 and 16 queries over lengths 200..263 (the embedded pair's
attention shape: 6 query heads, 2 KV heads, head dim 64; bf16), each length
twice in a row: the first call of a length is cold, the second warm. Also
the same block attention written as two matmuls and a softmax. Prints the
mean of each, in ms (each call evaluated alone, with a sync).
"""

import time

import mlx.core as mx

HEADS, KV_HEADS, DIM = 6, 2, 64
LENGTHS = range(200, 264)


def sdpa(q, k, v):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=DIM ** -0.5,
                                                mask="causal" if q.shape[2] > 1 else None)


def by_matmul(q, k, v):
    k = mx.repeat(k, HEADS // KV_HEADS, axis=1)
    v = mx.repeat(v, HEADS // KV_HEADS, axis=1)
    scores = (q * DIM ** -0.5) @ k.transpose(0, 1, 3, 2)
    return mx.softmax(scores.astype(mx.float32), axis=-1).astype(q.dtype) @ v


def timed(f, *args) -> float:
    start = time.perf_counter()
    mx.eval(f(*args))
    mx.synchronize()
    return (time.perf_counter() - start) * 1e3


def main():
    print("device", mx.default_device())
    key = mx.random.key(0)
    for name, f in (("sdpa", sdpa), ("matmul+softmax", by_matmul)):
        for queries in (1, 16):
            q = mx.random.normal((1, HEADS, queries, DIM), key=key).astype(mx.bfloat16)
            timed(f, q, *[mx.random.normal((1, KV_HEADS, 64, DIM), key=key).astype(mx.bfloat16)] * 2)
            cold, warm = [], []
            for length in LENGTHS:
                kv = mx.random.normal((1, KV_HEADS, length, DIM), key=key).astype(mx.bfloat16)
                mx.eval(kv)
                cold.append(timed(f, q, kv, kv))
                warm.append(timed(f, q, kv, kv))
            print(f"{name:<15} {queries:>2} queries: first call of a length {sum(cold) / len(cold):7.3f} ms, "
                  f"second {sum(warm) / len(warm):7.3f} ms ({len(cold)} lengths)")


if __name__ == "__main__":
    main()
