#!/usr/bin/env bash
# On the H200, after scripts/h200-remote.sh has unpacked the CUDA pack: where
# a DFlash round's time goes and whether GPU decoding is lossless on the
# embedded pair (docs/acceptance.md, "On the H200"). Writes into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/flashbar-h200/pkg PYTHONUNBUFFERED=1
bin=/tmp/flashbar-h200/pkg/flashbar model=models/default/target drafter=models/default/drafter
echo "== quantized matmul row invariance (M rows vs 1 row)"
python3 bench/row_invariance.py > "$OUT/rows.txt" 2>&1
echo "$(grep -c 'differing  0/' "$OUT/rows.txt") checks identical; the others:"
grep differing "$OUT/rows.txt" | grep -v 'differing  0/'
echo "== repeated greedy runs of one prose prompt (plain twice, DFlash twice)"
for mode in off off dflash dflash; do
  "$bin" generate --model "$model" --drafter "$drafter" --speculation "$mode" --block-size 16 \
    --temperature 0 --max-tokens 96 --json "# This function computes" \
    | python3 -c 'import json, sys; print(sys.argv[1], json.load(sys.stdin)["token_ids"])' "$mode"
done | tee "$OUT/repeats.txt" | python3 -c '
import sys
runs = [(l.split(" ", 1)[0], eval(l.split(" ", 1)[1])) for l in sys.stdin]
base = runs[0][1]
for mode, ids in runs:
    first = next((i for i, (a, b) in enumerate(zip(ids + [-1], base + [-1])) if a != b), None)
    print(mode, len(ids), "tokens, first difference from plain run 1 at", first)'
printf '%s\n' 'def fib(n):' 'class Stack:\n    def __init__(self):\n' > /tmp/code-prompts.txt
for graphs in 1 0; do
  echo "== MLX_USE_CUDA_GRAPHS=$graphs"
  MLX_USE_CUDA_GRAPHS=$graphs "$bin" bench --model "$model" --verify-cost 2>&1 | tail -4
  MLX_USE_CUDA_GRAPHS=$graphs "$bin" bench --model "$model" --drafter "$drafter" --prompts /tmp/code-prompts.txt \
    --max-tokens 96 --block-size 16 --repeats 3 --json > "$OUT/bench-graphs$graphs.json" 2> "$OUT/bench-graphs$graphs.err"
  python3 - "$OUT/bench-graphs$graphs.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    fast = p["dflash"]
    rounds = [r for r in fast["rounds"] if r["mode"] == "dflash"]
    phases = sum(r["draft_ms"] + r["verify_ms"] + r["rollback_ms"] for r in rounds) / len(rounds)
    committed = sum(r["committed"] for r in rounds) / len(rounds)
    wall = committed / fast["decode_tokens_per_second"] * 1000
    print(f"AR {p['decode_tokens_per_second']:.0f} tok/s, DFlash {fast['decode_tokens_per_second']:.0f} tok/s, "
          f"{len(rounds)} rounds of {committed:.2f} tokens, phases {phases:.2f} ms vs {wall:.2f} ms a round")
PY
done
