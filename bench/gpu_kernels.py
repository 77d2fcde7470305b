"""Our row-invariant CUDA kernels against MLX's, on the GPU: exactness first,
then speed (docs/gpu.md).

    python3 bench/gpu_kernels.py [--quick] [--json OUT]

Loads the very kernel bodies the Rust engine runs (`kernels/cuda/qmm.cu`,
`kernels/cuda/attn_rows.cu` with `attn_merge.cu`) through `mx.fast.cuda_kernel`, with the launch
shapes of `flashbar_mlx::gpu_kernels` (`launch_qmm` below mirrors its rule,
and the Rust side's test pins the same table). Prints one JSON line per check:

- qmm, every layer shape of the embedded pair, Qwen3.5-9B and Qwen3.6-35B-A3B
  (4 and 8 bits, group 32/64/128, bf16 and f16): row i of an M-row product
  equals the 1-row product of row i bit for bit, for M = 1..32; and the
  largest difference from `mx.quantized_matmul`, relative to its largest
  value;
- qmm with GATHER (a MoE's experts, the 35B-A3B's 256 of 2048 -> 512 and
  512 -> 2048, top 8): each token's rows of an M-token call equal a 1-token
  call's bit for bit, and `mx.gather_qmm` within rounding (`--experts-only`
  runs just this);
- attn_rows: query i of a T-query call equals a 1-query call over the cache
  cut after query i (a decode step at that position), bit for bit; and the
  difference from `mx.fast.scaled_dot_product_attention`;
- speed, measured chained (64 calls in one evaluation over 8 weight copies,
  so neither the ~60 us of one evaluation nor the L2 is counted): GB/s of
  ours and of MLX's quantized matmul at M = 1 and 16, and attention at
  contexts of 1,024 and 8,192.

Exit status 1 if any exactness check fails.
"""

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
QMM = (ROOT / "kernels/cuda/qmm.cu").read_text()
ATTN = (ROOT / "kernels/cuda/attn_rows.cu").read_text()
FAILED = []


START = time.perf_counter()


def out(**row):
    row["at_s"] = round(time.perf_counter() - START, 1)
    print(json.dumps(row), flush=True)
    if row.get("ok") is False:
        FAILED.append(row)


_kernels = {}


def kernel(name, source, inputs, outputs):
    if name not in _kernels:
        _kernels[name] = mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs,
                                             source=source)
    return _kernels[name]


def launch_qmm(n: int, k: int, bits: int):
    """(NT, WARPS) from the weight's shape only; the same rule as the Rust
    `row_invariant::qmm_launch`."""
    chunks = -(-k // (4 * (128 // bits)))
    if n >= 65_536:
        return 4, max(1, min(2 if bits == 4 else 4, chunks // 2))
    return (4 if n >= 512 else 2 if n >= 64 else 1), max(1, min(8, chunks))


def qmm(x, w, scales, biases, bits, gs, tiles=None, warps=None):
    m, k = x.shape
    n = w.shape[0]
    nt, wp = launch_qmm(n, k, bits)
    nt, wp = tiles or nt, warps or wp
    f = kernel("flashbar_qmm", QMM, ["x", "w", "scales", "biases", "res", "pairs"], ["y"])
    blocks = -(-n // (8 * nt))
    # No fused ends (GLU = RES = GATHER = 0): x stands in for the unread residual and pairs.
    # The body reads a dense call's x as [B, T, K].
    x = x[None]
    return f(inputs=[x, w, scales, biases, x, x],
             template=[("BITS", bits), ("HALF", int(x.dtype == mx.float16)), ("NT", nt),
                       ("MT", 1 if m <= 16 else 2), ("GLU", 0), ("RES", 0), ("GATHER", 0),
                       ("P1", 0), ("P2", 0), ("P3", 0)],
                 grid=(blocks * 32 * wp, 1, 1), threadgroup=(32 * wp, 1, 1),
                 output_shapes=[(m, n)], output_dtypes=[x.dtype])[0]


MERGE = (ROOT / "kernels/cuda/attn_merge.cu").read_text()
CHUNK = 128  # attn_rows.cu's CHUNK, row_invariant::ATTN_CHUNK


def attn(q, k, v, scale, causal=True):
    """The two launches of `row_invariant::attention`: chunk partials, then
    their merge."""
    b, hq, t, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    chunks = -(-length // CHUNK)
    dt = {mx.float32: 0, mx.bfloat16: 1, mx.float16: 2}[q.dtype]
    f = kernel("flashbar_attn_rows", ATTN, ["q", "k", "v", "scale"], ["part", "stats"])
    part, stats = f(inputs=[q, k, v, mx.array([scale], dtype=mx.float32)],
                    template=[("D", d), ("GROUP", hq // hkv), ("DT", dt), ("CAUSAL", int(causal))],
                    grid=(b * hkv * chunks * t * 256, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(b, hq, t, chunks, d), (b, hq, t, chunks, 2)],
                    output_dtypes=[mx.float32, mx.float32])
    merge = kernel("flashbar_attn_merge", MERGE, ["part", "stats"], ["out"])
    # Written token-major [B, T, Hq, D]: returned as the [B, Hq, T, D] view.
    return merge(inputs=[part, stats], template=[("D", d), ("DT", dt)],
                 grid=(b * hq * t * d, 1, 1), threadgroup=(d, 1, 1),
                 output_shapes=[(b, t, hq, d)], output_dtypes=[q.dtype])[0].transpose(0, 2, 1, 3)


# (model, layer, in, out) at the models' real shapes.
SHAPES = [
    ("embedded", "q_proj", 384, 768), ("embedded", "kv_proj", 384, 128), ("embedded", "o_proj", 384, 384),
    ("embedded", "gdn in_proj_qkv", 384, 1024), ("embedded", "gdn in_proj_ba", 384, 8),
    ("embedded", "mlp gate/up", 384, 1152), ("embedded", "mlp down", 1152, 384),
    ("embedded", "lm_head", 384, 4096),
    ("9B", "attn q_proj", 4096, 8192), ("9B", "attn kv_proj", 4096, 1024), ("9B", "attn o_proj", 4096, 4096),
    ("9B", "gdn in_proj_qkv", 4096, 8192), ("9B", "gdn in_proj_z", 4096, 4096), ("9B", "gdn in_proj_ba", 4096, 32),
    ("9B", "gdn out_proj", 4096, 4096), ("9B", "mlp gate/up", 4096, 12288), ("9B", "mlp down", 12288, 4096),
    ("9B", "lm_head", 4096, 248320),
    ("35B-A3B", "attn q_proj", 2048, 8192), ("35B-A3B", "attn kv_proj", 2048, 512),
    ("35B-A3B", "attn o_proj", 4096, 2048), ("35B-A3B", "gdn in_proj_qkv", 2048, 8192),
    ("35B-A3B", "gdn out_proj", 4096, 2048), ("35B-A3B", "expert gate/up", 2048, 512),
    ("35B-A3B", "expert down", 512, 2048), ("35B-A3B", "shared expert gate/up", 2048, 512),
    ("35B-A3B", "router", 2048, 256), ("35B-A3B", "lm_head", 2048, 248320),
]
ROWS = (1, 2, 3, 5, 8, 15, 16, 17, 24, 31, 32)


def quantized(n, k, bits, gs, dtype, seed):
    w = (mx.random.normal((n, k), key=mx.random.key(seed)) * 0.02).astype(dtype)
    return mx.quantize(w, group_size=gs, bits=bits)


DTYPES = {"bf16": mx.bfloat16, "f16": mx.float16}


def parse_combos(text: str):
    """`4:32:bf16,8:64:f16` -> [(bits, group, dtype)]."""
    combos = []
    for item in text.split(","):
        bits, group, dtype = item.split(":")
        combos.append((int(bits), int(group), DTYPES[dtype]))
    return combos


def check_qmm(quick: bool, combos=None):
    if combos is None:
        combos = [(8, 64, mx.bfloat16), (4, 64, mx.bfloat16)]
        if not quick:
            combos += [(4, 32, mx.bfloat16), (4, 128, mx.bfloat16), (8, 128, mx.bfloat16), (8, 32, mx.float16),
                       (4, 64, mx.float16)]
    for bits, gs, dtype in combos:
        for seed, (model, layer, k, n) in enumerate(SHAPES):
            if model == "embedded" and bits == 4 and quick:
                continue
            wq, s, b = quantized(n, k, bits, gs, dtype, seed)
            x = mx.random.normal((32, k), key=mx.random.key(1000 + seed)).astype(dtype)
            singles = mx.concatenate([qmm(x[i:i + 1], wq, s, b, bits, gs) for i in range(32)])
            mx.eval(singles)
            differing = {}
            for m in ROWS:
                rows = qmm(x[:m], wq, s, b, bits, gs)
                bad = int(mx.sum(mx.any(rows != singles[:m], axis=-1)).item())
                if bad:
                    differing[m] = bad
            ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=gs, bits=bits)
            scale = float(mx.abs(ref.astype(mx.float32)).max().item())
            rel = float(mx.abs(singles.astype(mx.float32) - ref.astype(mx.float32)).max().item()) / max(scale, 1e-30)
            out(check="qmm rows", model=model, layer=layer, k=k, n=n, bits=bits, group=gs,
                dtype=str(dtype).split(".")[-1], rows_differing=differing, rel_diff_vs_mlx=round(rel, 6),
                ok=not differing and rel < 2e-2)


def gathered(x, w, scales, biases, rows, experts, tokens, bits, gs):
    """The experts' kernel (qmm.cu with GATHER): output row p is
    x[rows[p]] . w[experts[p]]^T; mirrors `row_invariant::gather_quantized_matmul`."""
    n, k = w.shape[1], x.shape[1]
    nt, wp = launch_qmm(n, k, bits)
    f = kernel("flashbar_qmm", QMM, ["x", "w", "scales", "biases", "res", "pairs"], ["y"])
    pairs = mx.stack([rows.astype(mx.int32), experts.astype(mx.int32)])
    return f(inputs=[x, w, scales, biases, x, pairs],
             template=[("BITS", bits), ("HALF", int(x.dtype == mx.float16)), ("NT", nt),
                       ("MT", 1 if tokens <= 16 else 2), ("GLU", 0), ("RES", 0), ("GATHER", 1),
                       ("P1", 0), ("P2", 0), ("P3", 0)],
             grid=(-(-n // (8 * nt)) * 32 * wp, w.shape[0], 1), threadgroup=(32 * wp, 1, 1),
             output_shapes=[(rows.size, n)], output_dtypes=[x.dtype])[0]


def check_experts():
    """The 35B-A3B's experts (256, top 8): each token's rows of an M-token
    call equal a 1-token call's bit for bit, and `mx.gather_qmm` within rounding."""
    experts_n, top = 256, 8
    for seed, (layer, k, n, per_token) in enumerate([("expert gate/up", 2048, 512, True),
                                                      ("expert down", 512, 2048, False)]):
        for bits in (4, 8):
            w = (mx.random.normal((experts_n, n, k), key=mx.random.key(seed)) * 0.02).astype(mx.bfloat16)
            wq, s, b = mx.quantize(w, group_size=64, bits=bits)
            # Token t meets experts (7t + 37j) % 256: distinct, some shared.
            idx = mx.array([[(7 * t + 37 * j) % experts_n for j in range(top)] for t in range(32)])
            x = mx.random.normal((32 if per_token else 32 * top, k), key=mx.random.key(50 + seed)).astype(mx.bfloat16)

            def call(m, first=0):
                pairs = m * top
                rows = mx.arange(pairs) // top if per_token else mx.arange(pairs)
                xs = x[first:first + m] if per_token else x[first * top:(first + m) * top]
                return gathered(xs, wq, s, b, rows, idx[first:first + m].reshape(-1), m, bits, 64)

            singles = mx.concatenate([call(1, t) for t in range(32)])
            mx.eval(singles)
            differing = {}
            for m in ROWS:
                bad = int(mx.sum(mx.any(call(m) != singles[:m * top], axis=-1)).item())
                if bad:
                    differing[m] = bad
            xr = x[:, None, None, :] if per_token else x.reshape(32, top, 1, k)
            ref = mx.gather_qmm(xr, wq, s, b, rhs_indices=idx, transpose=True, group_size=64, bits=bits)
            ref = ref.reshape(32 * top, n).astype(mx.float32)
            rel = float(mx.abs(singles.astype(mx.float32) - ref).max().item()) / max(
                float(mx.abs(ref).max().item()), 1e-30)
            out(check="experts rows", layer=layer, k=k, n=n, bits=bits, rows_differing=differing,
                rel_diff_vs_mlx=round(rel, 6), ok=not differing and rel < 2e-2)
            if not per_token:
                # The block's weighted sum over a token's experts (MLX's ops,
                # as nn/moe.rs runs them): a token's sum alone against in M.
                scores = mx.softmax(mx.random.normal((32, top), key=mx.random.key(77)), axis=-1).astype(mx.bfloat16)
                y = singles.reshape(32, 1, top, n)

                def weighted(m, first=0):
                    return (y[first:first + m] * scores[first:first + m, None, :, None]).sum(axis=-2)

                alone = mx.concatenate([weighted(1, t) for t in range(32)])
                bad = {m: int(mx.sum(mx.any(weighted(m) != alone[:m], axis=-1)).item()) for m in ROWS}
                bad = {m: v for m, v in bad.items() if v}
                out(check="experts weighted sum rows", n=n, rows_differing=bad, ok=not bad)


def check_attn():
    # Contexts inside one chunk, across chunks, and with the block's 16
    # queries straddling a chunk boundary (264: positions 248..263).
    for hq, hkv, d, length in ((6, 2, 64, 300), (16, 4, 256, 700), (32, 2, 128, 1100), (16, 2, 256, 64),
                               (16, 4, 256, 264)):
        for dtype in (mx.bfloat16, mx.float16, mx.float32):
            key = mx.random.key(d + length)
            kq, kk, kv = mx.random.split(key, 3)
            t = 16
            q = mx.random.normal((1, hq, t, d), key=kq).astype(dtype)
            k = mx.random.normal((1, hkv, length, d), key=kk).astype(dtype)
            v = mx.random.normal((1, hkv, length, d), key=kv).astype(dtype)
            scale = d ** -0.5
            block = attn(q, k, v, scale)
            singles = mx.concatenate(
                [attn(q[:, :, i:i + 1], k[:, :, :length - t + i + 1], v[:, :, :length - t + i + 1], scale)
                 for i in range(t)], axis=2)
            bad = int(mx.sum(mx.any(block != singles, axis=(0, 1, 3))).item())
            # f32 against the CPU's sdpa: MLX's f32 sdpa on CUDA differs from
            # an f32 sum by ~2e-4 (more than its f16 does), a TF32 product's size.
            ref_at = mx.cpu if dtype == mx.float32 else None
            ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal", stream=ref_at)
            diff = float(mx.abs(block.astype(mx.float32) - ref.astype(mx.float32)).max().item())
            out(check="attn rows", heads=hq, kv_heads=hkv, head_dim=d, context=length,
                dtype=str(dtype).split(".")[-1], queries_differing=bad, max_diff_vs_sdpa=round(diff, 6),
                ok=bad == 0 and diff < (2e-2 if dtype != mx.float32 else 1e-4))
            # A drafted block: every query over every key.
            block = attn(q, k, v, scale, causal=False)
            singles = mx.concatenate([attn(q[:, :, i:i + 1], k, v, scale, causal=False) for i in range(t)], axis=2)
            bad = int(mx.sum(mx.any(block != singles, axis=(0, 1, 3))).item())
            ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, stream=ref_at)
            diff = float(mx.abs(block.astype(mx.float32) - ref.astype(mx.float32)).max().item())
            out(check="attn rows, no mask", heads=hq, kv_heads=hkv, head_dim=d, context=length,
                dtype=str(dtype).split(".")[-1], queries_differing=bad, max_diff_vs_sdpa=round(diff, 6),
                ok=bad == 0 and diff < (2e-2 if dtype != mx.float32 else 1e-4))


GDN_LAYER = (ROOT / "kernels/cuda/gdn_layer.cu").read_text()
GDN_INPUTS = ["qkv", "z", "b_in", "a_in", "conv_state", "conv_w", "a_log", "dt_bias", "norm_w", "consts",
              "state"]
GDN_OUTPUTS = ["out", "state_out", "conv_out", "k_tape", "g_tape", "delta"]


def gdn_layer(source, name, ins, hk, hv, dk, dv, dt, split=1):
    """One launch of a gated-delta layer body, as `gdn_kernels::layer`
    launches it (same template, grid and outputs); `split` threads a state
    row (FLASHBAR_GDN_SPLIT)."""
    qkv = ins[0]
    b, t, c = qkv.shape
    threads = (split * dv + 31) // 32 * 32
    f = kernel(name, source, GDN_INPUTS, GDN_OUTPUTS)
    code = {mx.float32: 0, mx.bfloat16: 1, mx.float16: 2}[dt]
    return f(inputs=ins,
             template=[("HK", hk), ("HV", hv), ("DK", dk), ("DV", dv), ("K", 4), ("SPLIT", split),
                       ("NT", threads),
                       ("DT", code), ("RA", code), ("RN", code)],
             grid=(b * hv * threads, 1, 1), threadgroup=(threads, 1, 1),
             output_shapes=[(b, t, hv * dv), (b, hv, dv, dk), (b, 3, c), (b, t, hk, dk), (b, t, hv),
                            (b, t, hv, dv)],
             output_dtypes=[dt, mx.float32, dt, mx.float32, mx.float32, mx.float32])


GDN_REPLAY = (ROOT / "kernels/cuda/gdn_replay.cu").read_text()


def gdn_replay(source, name, state0, k, g, delta, n, hk, hv, dk, dv):
    """One launch of gdn_replay.cu as `gdn_kernels::replay` launches it: the
    first n steps of a tape replayed from state0, a thread a state row."""
    f = kernel(name, source, ["state0", "k", "g", "delta", "n_steps"], ["state_out"])
    rows = state0.shape[0] * hv * dv
    return f(inputs=[state0, k, g, delta, mx.array([n], mx.int32)],
             template=[("HK", hk), ("HV", hv), ("DK", dk), ("DV", dv)],
             grid=(rows, 1, 1), threadgroup=(64, 1, 1),
             output_shapes=[state0.shape], output_dtypes=[mx.float32])[0]


def gdn_inputs(t, hk, hv, dk, dv, dt, seed):
    c = 2 * hk * dk + hv * dv
    keys = mx.random.split(mx.random.key(seed), 11)
    normal = lambda i, shape, scale=1.0: (scale * mx.random.normal(shape, key=keys[i]))
    return [normal(0, (1, t, c)).astype(dt), normal(1, (1, t, hv * dv)).astype(dt),
            normal(2, (1, t, hv)).astype(dt), normal(3, (1, t, hv)).astype(dt),
            normal(4, (1, 3, c)).astype(dt), normal(5, (c, 4), 0.5),
            mx.log(mx.random.uniform(1.0, 16.0, (hv,), key=keys[6])), normal(7, (hv,), 0.1),
            1.0 + normal(8, (dv,), 0.1), mx.array([1e-6, 1e-6, dk ** -1.0, dk ** -0.5]),
            normal(10, (1, hv, dv, dk), 0.1)]


def check_gdn(old_path=None, old_replay_path=None):
    """kernels/cuda/gdn_layer.cu: its T-token call against its own 1-token
    calls in turn (the out rows and the final state, bit for bit); with
    `old_path` (another body of the same kernel, e.g. the one before an
    edit) every output against that body's, bit for bit, for T = 1 .. 100;
    then timed chained at T = 1 and 16 (beside the old body). The same
    for a state row over four threads (`split` 4): its block against its
    steps bit for bit, its outputs against a thread a row's within
    rounding (its dot products sum in another order), timed beside.
    gdn_replay.cu on the block's tape: the first n steps replayed equal the
    state after n one-token calls, bit for bit (and, with
    `old_replay_path`, the older replay body's, timed beside)."""
    old = Path(old_path).read_text() if old_path else None
    old_replay = Path(old_replay_path).read_text() if old_replay_path else None
    for hk, hv, dk, dv in ((4, 8, 64, 64), (16, 32, 128, 128)):
        for dt in (mx.bfloat16, mx.float32):
            for t in (1, 2, 8, 9, 16, 17, 100) if old else ():
                ins = gdn_inputs(t, hk, hv, dk, dv, dt, 7 * t + dk)
                before = gdn_layer(old, "flashbar_gdn_layer_old", ins, hk, hv, dk, dv, dt)
                now = gdn_layer(GDN_LAYER, "flashbar_gdn_layer", ins, hk, hv, dk, dv, dt)
                differing = [n for n, a, b in zip(GDN_OUTPUTS, before, now) if not mx.array_equal(a, b).item()]
                out(check="gdn_layer vs the old body", heads=hv, dim=dk, tokens=t,
                    dtype=str(dt).split(".")[-1], outputs_differing=differing, ok=not differing)
            t = 16
            ins = gdn_inputs(t, hk, hv, dk, dv, dt, 99 + dk)
            blocks = {}
            for split in (1, 4):
                block = gdn_layer(GDN_LAYER, "flashbar_gdn_layer", ins, hk, hv, dk, dv, dt, split)
                blocks[split] = block
                conv, state, rows, states = ins[4], ins[10], [], [ins[10]]
                for i in range(t):
                    one = [a[:, i:i + 1] for a in ins[:4]] + [conv] + ins[5:10] + [state]
                    step = gdn_layer(GDN_LAYER, "flashbar_gdn_layer", one, hk, hv, dk, dv, dt, split)
                    rows.append(step[0])
                    conv, state = step[2], step[1]
                    states.append(state)
                if split == 1:
                    # A rollback: the block's tape replayed n steps from its start.
                    for n in (0, 1, 7, t):
                        tape = (ins[10], block[3], block[4], block[5], n, hk, hv, dk, dv)
                        replayed = gdn_replay(GDN_REPLAY, "flashbar_gdn_replay", *tape)
                        ok = mx.array_equal(replayed, states[n]).item()
                        row = dict(check="gdn_replay vs the layer's steps", heads=hv, dim=dk, steps=n,
                                   dtype=str(dt).split(".")[-1], ok=bool(ok))
                        if old_replay:
                            before = gdn_replay(old_replay, "flashbar_gdn_replay_old", *tape)
                            row["old_body_bit_identical"] = bool(mx.array_equal(replayed, before).item())
                            row["ok"] = row["ok"] and row["old_body_bit_identical"]
                        out(**row)
                same = mx.array_equal(block[0], mx.concatenate(rows, axis=1)).item() and \
                    mx.array_equal(block[1], state).item()
                out(check="gdn_layer block vs steps", heads=hv, dim=dk, split=split,
                    dtype=str(dt).split(".")[-1], ok=bool(same))
            # Four threads a row against one: the same values within rounding;
            # the conv state and the normalized keys are computed alike.
            worst = {}
            for n, a, b in zip(GDN_OUTPUTS, blocks[1], blocks[4]):
                a, b = a.astype(mx.float32), b.astype(mx.float32)
                worst[n] = float((mx.abs(a - b).max() / (mx.abs(a).max() + 1e-30)).item())
            tolerance = 3e-2 if dt != mx.float32 else 1e-4
            out(check="gdn_layer four threads a row vs one", heads=hv, dim=dk, dtype=str(dt).split(".")[-1],
                worst=worst, ok=max(worst.values()) < tolerance and worst["conv_out"] == 0
                and worst["k_tape"] == 0)
    hk, hv, dk, dv = 16, 32, 128, 128
    bodies = [("now", GDN_LAYER, "flashbar_gdn_layer", 1), ("split4", GDN_LAYER, "flashbar_gdn_layer", 4)] \
        + ([("old", old, "flashbar_gdn_layer_old", 1)] if old else [])
    for t in (1, 16):
        sets = [gdn_inputs(t, hk, hv, dk, dv, mx.bfloat16, 500 + i) for i in range(4)]
        mx.eval(sets)
        row = dict(check="gdn layer speed", heads=hv, dim=dk, tokens=t)
        for label, source, name, split in bodies:
            us = chained(lambda: [gdn_layer(source, name, sets[i % 4], hk, hv, dk, dv, mx.bfloat16, split)[0]
                                  for i in range(64)])
            row[f"{label}_us"] = round(us * 1e6, 1)
        out(**row)
    # The replay of 8 steps at the 9B's heads, chained, beside the old body.
    state0 = 0.1 * mx.random.normal((1, hv, dv, dk), key=mx.random.key(3))
    tapes = [(state0, mx.random.normal((1, 16, hk, dk), key=mx.random.key(4 + i)),
              mx.random.uniform(0.5, 1.0, (1, 16, hv), key=mx.random.key(8 + i)),
              mx.random.normal((1, 16, hv, dv), key=mx.random.key(12 + i))) for i in range(4)]
    mx.eval(tapes)
    row = dict(check="gdn replay speed", heads=hv, dim=dk, steps=8)
    for label, source, name in [("now", GDN_REPLAY, "flashbar_gdn_replay")] + (
            [("old", old_replay, "flashbar_gdn_replay_old")] if old_replay else []):
        us = chained(lambda: [gdn_replay(source, name, *tapes[i % 4], 8, hk, hv, dk, dv) for i in range(64)])
        row[f"{label}_us"] = round(us * 1e6, 1)
    out(**row)


def profile_gdn(tokens, split):
    """A few calls of gdn_layer.cu at the 9B's heads (bf16, `tokens` a call,
    `split` threads a state row), each evaluated alone: what
    `bench/h200-steps.sh gdnprof` runs under Nsight Compute."""
    hk, hv, dk, dv = 16, 32, 128, 128
    ins = gdn_inputs(tokens, hk, hv, dk, dv, mx.bfloat16, 11)
    mx.eval(ins)
    for _ in range(6):
        mx.eval(gdn_layer(GDN_LAYER, "flashbar_gdn_layer", ins, hk, hv, dk, dv, mx.bfloat16, split))
    out(check="gdn layer profiled", tokens=tokens, split=split, calls=6)


def check_mlx_ops():
    """The MLX ops a decode step and a verify share besides ours: are their
    rows invariant too? (depthwise conv1d of the gated-delta layers, rms_norm)."""
    for channels, taps in ((1024, 4), (8192, 4)):
        w = mx.random.normal((channels, taps, 1), key=mx.random.key(7)).astype(mx.bfloat16)
        x = mx.random.normal((1, taps - 1 + 16, channels), key=mx.random.key(8)).astype(mx.bfloat16)
        block = mx.conv1d(x, w, groups=channels)
        singles = mx.concatenate([mx.conv1d(x[:, i:i + taps], w, groups=channels) for i in range(16)], axis=1)
        bad = int(mx.sum(mx.any(block != singles, axis=(0, 2))).item())
        out(check="mlx conv1d rows", channels=channels, taps=taps, rows_differing=bad, ok=bad == 0)
    for width in (384, 4096):
        x = mx.random.normal((1, 16, width), key=mx.random.key(9)).astype(mx.bfloat16)
        wt = mx.random.normal((width,), key=mx.random.key(10)).astype(mx.bfloat16)
        block = mx.fast.rms_norm(x, wt, 1e-6)
        singles = mx.concatenate([mx.fast.rms_norm(x[:, i:i + 1], wt, 1e-6) for i in range(16)], axis=1)
        bad = int(mx.sum(mx.any(block != singles, axis=(0, 2))).item())
        out(check="mlx rms_norm rows", width=width, rows_differing=bad, ok=bad == 0)


def chained(make, reps=5, calls=64):
    mx.eval(make()); mx.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        mx.eval(make())
    mx.synchronize()
    return (time.perf_counter() - start) / reps / calls


def speed_qmm(variants: bool):
    picks = [s for s in SHAPES if s[0] == "9B"] + [s for s in SHAPES if s[0] == "35B-A3B" and "lm" not in s[1]][:3]
    for model, layer, k, n in picks:
        copies = []
        for c in range(2 if n > 100_000 else 8):
            wq, s, b = quantized(n, k, 4, 64, mx.bfloat16, 50 + c)
            mx.eval(wq, s, b)
            copies.append((wq, s, b))
        nbytes = sum(a.nbytes for a in copies[0])
        for m in (1, 16):
            xs = [mx.random.normal((m, k), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(64)]
            mx.eval(xs)
            t_mlx = chained(lambda: [mx.quantized_matmul(xs[i], *copies[i % len(copies)], transpose=True,
                                                         group_size=64, bits=4) for i in range(64)])
            row = dict(check="qmm speed", model=model, layer=layer, k=k, n=n, M=m,
                       mlx_us=round(t_mlx * 1e6, 1), mlx_GBps=round(nbytes / t_mlx / 1e9, 1))
            for variant in [None] + ([(1, 4), (2, 8), (4, 8), (4, 2), (2, 4)] if variants else []):
                tiles, warps = variant or (None, None)
                t_ours = chained(lambda: [qmm(xs[i], *copies[i % len(copies)], 4, 64, tiles, warps)
                                          for i in range(64)])
                label = "ours" if variant is None else f"nt{tiles}_w{warps}"
                row[f"{label}_us"] = round(t_ours * 1e6, 1)
                row[f"{label}_GBps"] = round(nbytes / t_ours / 1e9, 1)
            out(**row)


def speed_attn():
    for hq, hkv, d in ((16, 4, 256), (16, 2, 256), (6, 2, 64)):
        for length in (1024, 8192):
            for t in (1, 16):
                q = mx.random.normal((1, hq, t, d)).astype(mx.bfloat16)
                ks = [mx.random.normal((1, hkv, length, d)).astype(mx.bfloat16) for _ in range(4)]
                mx.eval(q, ks)
                mask = "causal" if t > 1 else None
                t_sdpa = chained(lambda: [mx.fast.scaled_dot_product_attention(
                    q, ks[i % 4], ks[(i + 1) % 4], scale=d ** -0.5, mask=mask) for i in range(64)])
                t_ours = chained(lambda: [attn(q, ks[i % 4], ks[(i + 1) % 4], d ** -0.5) for i in range(64)])
                kv_bytes = 2 * hkv * length * d * 2  # keys and values, bf16
                out(check="attn speed", heads=hq, kv_heads=hkv, head_dim=d, context=length, queries=t,
                    sdpa_us=round(t_sdpa * 1e6, 1), ours_us=round(t_ours * 1e6, 1),
                    sdpa_GBps=round(kv_bytes / t_sdpa / 1e9, 1), ours_GBps=round(kv_bytes / t_ours / 1e9, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer quantization combinations")
    parser.add_argument("--variants", action="store_true", help="time other (NT, WARPS) launches too")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--combos", type=parse_combos, default=None,
                        help="check only these quantizations, e.g. 4:32:bf16,8:64:f16 (bits:group:dtype)")
    parser.add_argument("--experts-only", action="store_true", help="only the MoE experts' exactness")
    parser.add_argument("--attn-only", action="store_true", help="only attention: exactness, then speed")
    parser.add_argument("--gdn-only", action="store_true",
                        help="only gdn_layer.cu: a block against its steps, bit for bit, then timed")
    parser.add_argument("--gdn-old", default=None, metavar="FILE",
                        help="with --gdn-only: also against this older body of gdn_layer.cu, bit for "
                             "bit, and timed beside it")
    parser.add_argument("--gdn-replay-old", default=None, metavar="FILE",
                        help="with --gdn-only: an older body of gdn_replay.cu, bit for bit and timed beside")
    parser.add_argument("--gdn-profile", type=int, default=None, metavar="T",
                        help="only six calls of gdn_layer.cu at the 9B's heads, T tokens each (for ncu)")
    parser.add_argument("--gdn-split", type=int, default=1, choices=(1, 4),
                        help="with --gdn-profile: threads a state row")
    args = parser.parse_args()
    # Where a stuck run waits (a kernel, a compile), every 60 s.
    faulthandler.dump_traceback_later(60, repeat=True)
    out(device=str(mx.default_device()), mlx=mx.__version__)
    steps = (lambda: check_qmm(args.quick, args.combos), check_experts, check_attn, check_mlx_ops)
    if args.experts_only:
        steps = (check_experts,)
    elif args.gdn_profile is not None:
        steps = (lambda: profile_gdn(args.gdn_profile, args.gdn_split),)
    elif args.gdn_only:
        steps = (lambda: check_gdn(args.gdn_old, args.gdn_replay_old),)
    elif args.attn_only:
        steps = (check_attn,) + (() if args.no_speed else (speed_attn,))
    elif not args.no_speed:
        steps += (lambda: speed_qmm(args.variants), speed_attn)
    for step in steps:
        try:
            step()
        except Exception as error:  # a compile error names the kernel; keep going
            out(check="error", error=str(error)[:3000], ok=False)
    out(failed=len(FAILED))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
