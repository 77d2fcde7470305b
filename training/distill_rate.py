"""How fast this machine distills: the target's greedy generation at one
batch size, timed, to size a run of `train_drafter.py --distill-only`.

    python training/distill_rate.py [--batch 32] [--steps 48] [--target DIR]

Prints the milliseconds of the prompt's forward and of a decode step (the
first 8 steps apart, since a new shape can cost a plan or a compile the
first time, see docs/acceptance.md), and the sequences per second that a
run of prompt 64 + 192 generated tokens would reach, as one line starting
`RATE` (for scripts that try several settings: MLX reads
MLX_USE_CUDA_GRAPHS and MLX_CUDA_USE_CUDNN_SDPA at start, so each setting
is its own process).
"""

import argparse
import os
import time
from pathlib import Path

import mlx.core as mx

import common


def bisect(model, tokens) -> None:
    """One decode step after the prompt, evaluated piece by piece (each
    layer's norm, mixer and MLP, then the head), printing the first piece
    that fails: for a backend that rejects a kernel launch."""
    from mlx_lm.models.base import create_attention_mask, create_ssm_mask

    cache = model.make_cache()
    step = mx.argmax(model(tokens, cache=cache)[:, -1], axis=-1)
    mx.eval(step)
    inner = model.language_model.model
    h = inner.embed_tokens(step[:, None])
    fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
    pieces = []
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        kind = "gdn" if layer.is_linear else "attention"
        mixer = layer.linear_attn if layer.is_linear else layer.self_attn
        mask = ssm_mask if layer.is_linear else fa_mask
        pieces.append((f"layer {i} input norm", lambda x, l=layer: l.input_layernorm(x), False))
        pieces.append((f"layer {i} {kind}", lambda x, m=mixer, k=mask, cc=c: m(x, k, cc), True))
        pieces.append((f"layer {i} post norm + mlp", lambda x, l=layer: l.mlp(l.post_attention_layernorm(x)), True))
    pieces.append(("final norm", inner.norm, False))
    pieces.append(("lm head (embedding as linear)", inner.embed_tokens.as_linear, False))
    residual = h
    x = h
    for name, fn, adds in pieces:
        try:
            y = fn(x)
            mx.eval(y)
        except Exception as error:  # the backend's error names no op
            print(f"BISECT failed at {name} (input {tuple(x.shape)} {x.dtype}): {error}", flush=True)
            return
        if adds:
            residual = residual + y
            x = residual
        else:
            x = y
    print("BISECT every piece of one decode step ran", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--generate", type=int, default=192)
    parser.add_argument("--sync", action="store_true",
                        help="evaluate each step before building the next (no async_eval)")
    parser.add_argument("--bisect", action="store_true",
                        help="first run one decode step piece by piece and say what fails")
    parser.add_argument("--target", type=Path, default=common.ROOT / "models" / "default" / "target")
    args = parser.parse_args()
    common.use_chunked_gdn()
    model = common.load_target(args.target)
    vocab = model.language_model.args.vocab_size
    mx.random.seed(0)
    tokens = mx.random.randint(4, vocab, (args.batch, args.prompt))

    def run(steps: int) -> tuple[float, list[float]]:
        cache = model.make_cache()
        began = time.perf_counter()
        step = mx.argmax(model(tokens, cache=cache)[:, -1], axis=-1)
        mx.eval(step)
        prefill = time.perf_counter() - began
        marks = [time.perf_counter()]
        for done in range(1, steps + 1):
            step = mx.argmax(model(step[:, None], cache=cache)[:, -1], axis=-1)
            (mx.eval if args.sync else mx.async_eval)(step)
            if done in (8, steps):
                mx.eval(step)
                marks.append(time.perf_counter())
        return prefill, marks

    if args.bisect:
        bisect(model, tokens)
    run(args.steps)  # shapes seen once: kernels compiled, plans built
    prefill, marks = run(args.steps)
    first = (marks[1] - marks[0]) / 8 * 1e3
    rest = (marks[2] - marks[1]) / (args.steps - 8) * 1e3
    per_sequence = (prefill * 1e3 + rest * args.generate) / args.batch / 1e3
    settings = " ".join(f"{k}={os.environ[k]}" for k in ("MLX_USE_CUDA_GRAPHS", "MLX_CUDA_USE_CUDNN_SDPA")
                        if k in os.environ)
    print(f"RATE batch={args.batch} sync={int(args.sync)} seq_per_s={1 / per_sequence:.1f} prefill_ms={prefill * 1e3:.1f} "
          f"step_ms_first8={first:.2f} step_ms_rest={rest:.2f} device={mx.default_device()} {settings}",
          flush=True)


if __name__ == "__main__":
    main()
