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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--generate", type=int, default=192)
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
            mx.async_eval(step)
            if done in (8, steps):
                mx.eval(step)
                marks.append(time.perf_counter())
        return prefill, marks

    run(args.steps)  # shapes seen once: kernels compiled, plans built
    prefill, marks = run(args.steps)
    first = (marks[1] - marks[0]) / 8 * 1e3
    rest = (marks[2] - marks[1]) / (args.steps - 8) * 1e3
    per_sequence = (prefill * 1e3 + rest * args.generate) / args.batch / 1e3
    settings = " ".join(f"{k}={os.environ[k]}" for k in ("MLX_USE_CUDA_GRAPHS", "MLX_CUDA_USE_CUDNN_SDPA")
                        if k in os.environ)
    print(f"RATE batch={args.batch} seq_per_s={1 / per_sequence:.1f} prefill_ms={prefill * 1e3:.1f} "
          f"step_ms_first8={first:.2f} step_ms_rest={rest:.2f} device={mx.default_device()} {settings}",
          flush=True)


if __name__ == "__main__":
    main()
