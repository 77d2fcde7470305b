"""The verify / decode cost ratio that caps DFlash's speedup, at a real shape
with random 4-bit weights, measured by `flashbar bench --verify-cost` (one
decode step and one 16-token verify with taps and tape, same context, one run).

    python3 bench/verify_cost.py --shape qwen3.5-9b --flashbar target/release/flashbar
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_mlx_lm import SHAPES, write_checkpoint  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=SHAPES, default="mid")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--flashbar", default="target/release/flashbar")
    parser.add_argument("--context-tokens", type=int, default=256)
    parser.add_argument("--block", type=int, default=16)
    args = parser.parse_args()
    path = args.dir or Path("/tmp/flashbar-bench-models") / args.shape
    if not (path / "config.json").is_file():
        write_checkpoint(path, SHAPES[args.shape])
    subprocess.run([args.flashbar, "bench", "--model", str(path), "--verify-cost",
                    "--block", str(args.block), "--context-tokens", str(args.context_tokens),
                    "--repeats", "15"], check=True)


if __name__ == "__main__":
    main()
