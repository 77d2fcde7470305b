"""DFlash output == plain decoding output, through the `flashbar` binary, on
any device (the Rust tests prove it on CPU; this runs it where they cannot,
e.g. the H200 with the CUDA build).

    python3 bench/lossless_check.py --flashbar target/release/flashbar --fixtures target/fixtures

For each (target, drafter) fixture pair, prompt, block size and temperature
it compares the token ids of `--speculation off` and `--speculation dflash`
and prints one line per pair plus any mismatch; exit status 1 on a mismatch.
--pairs TARGET:DRAFTER ... picks other pairs in --fixtures, e.g. the GPU-size
ones of bench/gpu_fixtures.py (docs/gpu.md, "Checks"):

    --pairs dense-mlx-4bit-h256:drafter-dense-h256 moe-mlx-4bit-h256:drafter-sliding-h256

On a GPU the first `flashbar` process compiles the kernels and later ones
take them from the NVRTC cache (on by default: a second start of the
dense pair takes ~1 s instead of ~19 s on an H100; docs/gpu.md, "The NVRTC
cache"). It prints one line a prompt as it goes.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

PAIRS = [("dense-mlx-4bit", "drafter-dense-f32"), ("moe-mlx-4bit", "drafter-sliding-f32")]
PROMPTS = ["def fib(n):", "hello world", "import os\nclass Point:", "the quick brown fox",
           "for i in range(10):", "café 日本語", "return", "print hello", "x", "Speculative"]


def generate(binary, target, drafter, prompt, speculation, block, temperature, max_tokens):
    cmd = [binary, "generate", "--model", str(target), "--drafter", str(drafter),
           "--speculation", speculation, "--block-size", str(block),
           "--temperature", str(temperature), "--seed", "7",
           "--max-tokens", str(max_tokens), "--json", prompt]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def as_bf16(source: Path, dest: Path) -> Path:
    """A copy of a checkpoint with every float tensor in bf16 (MLX's CUDA
    build JIT-compiles f32 quantized matmuls, which needs CUDA headers that
    a torch-only machine may lack; bf16 is what real checkpoints use)."""
    import shutil

    import mlx.core as mx

    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    for file in source.glob("*.safetensors"):
        tensors = mx.load(str(file))
        tensors = {k: v.astype(mx.bfloat16) if v.dtype == mx.float32 else v
                   for k, v in tensors.items()}
        mx.save_safetensors(str(dest / file.name), tensors, metadata={"format": "mlx"})
    return dest


def pair(text: str) -> tuple:
    target, sep, drafter = text.partition(":")
    if not (target and sep and drafter):
        raise argparse.ArgumentTypeError(f"{text!r} is not TARGET:DRAFTER")
    return target, drafter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flashbar", required=True)
    parser.add_argument("--fixtures", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--bf16", action="store_true", help="run on bf16 copies of the targets")
    parser.add_argument("--pairs", nargs="+", type=pair, default=PAIRS, metavar="TARGET:DRAFTER",
                        help="fixture pairs in --fixtures (default: "
                        + " ".join(":".join(p) for p in PAIRS) + ")")
    args = parser.parse_args()
    failures = 0
    for target, drafter in args.pairs:
        target, drafter = args.fixtures / target, args.fixtures / drafter
        if args.bf16:
            target = as_bf16(target, Path("/tmp/flashbar-lossless") / (target.name + "-bf16"))
        checked = 0
        for temperature in (0.0, 0.8):
            for prompt in PROMPTS[:args.prompts]:
                plain = generate(args.flashbar, target, drafter, prompt, "off", 16,
                                 temperature, args.max_tokens)
                same = []
                for block in (4, 8, 16):
                    fast = generate(args.flashbar, target, drafter, prompt, "dflash", block,
                                    temperature, args.max_tokens)
                    checked += 1
                    if fast["token_ids"] != plain["token_ids"]:
                        failures += 1
                        first = next(i for i, (a, b) in enumerate(
                            zip(fast["token_ids"] + [-1], plain["token_ids"] + [-1])) if a != b)
                        print(f"MISMATCH {target.name} T={temperature} block {block} "
                              f"{prompt!r}: first difference at token {first}", flush=True)
                    else:
                        same.append(block)
                # One line a prompt, as it goes: a run cut short still says
                # what it checked.
                print(f"  {target.name} T={temperature} {prompt!r}: identical at blocks {same}",
                      flush=True)
        print(f"{target.name} + {drafter.name}: {checked} dflash runs checked against plain decoding",
              flush=True)
    print("lossless: " + ("FAILED" if failures else "all identical"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
