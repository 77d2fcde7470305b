#!/usr/bin/env bash
# On the H200, after scripts/h200-remote.sh has unpacked the CUDA pack and a
# freshly built binary sits at $BIN: the row-invariant kernels (docs/gpu.md)
# checked and timed, then the embedded pair end to end with them and with
# MLX's kernels (FLASHBAR_GPU_KERNELS=mlx), in one run. Writes into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/flashbar-h200/pkg PYTHONUNBUFFERED=1
bin=${BIN:-/tmp/flashbar-h200/pkg/flashbar}
echo "== kernels: exactness and speed (bench/gpu_kernels.py ${KERNEL_ARGS:-})"
timeout "${KERNEL_SECONDS:-240}" python3 bench/gpu_kernels.py ${KERNEL_ARGS:-} > "$OUT/kernels.jsonl" 2>&1
echo "exit $?; failed checks:"
grep '"ok": false' "$OUT/kernels.jsonl" | head -20
tail -1 "$OUT/kernels.jsonl"
echo "== flashbar smoke"
timeout 120 "$bin" smoke > "$OUT/smoke.txt" 2>&1; echo "exit $?"; tail -12 "$OUT/smoke.txt"
for kernels in ours mlx; do
  echo "== acceptance, kernels: $kernels"
  if [ "$kernels" = mlx ]; then export FLASHBAR_GPU_KERNELS=mlx; fi
  timeout "${ACCEPT_SECONDS:-150}" python3 bench/acceptance.py --flashbar "$bin" --no-reference \
    --max-tokens 96 --repeats 2 --json "$OUT/acceptance-$kernels.json" > "$OUT/acceptance-$kernels.txt" 2>&1
  echo "exit $?"; tail -14 "$OUT/acceptance-$kernels.txt"
done
