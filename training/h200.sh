#!/usr/bin/env bash
# Device side of the training, on the NVIDIA machine (MLX's CUDA wheel, no
# registry): after bench/h200-run.sh has unpacked the wheels,
#   bash training/h200.sh target   step 1 (corpus, tokenizer, target)
#   bash training/h200.sh drafter  step 2 (self-distillation, drafter)
# Each step fits one 10-minute call; outputs land in /tmp/flashbar-train and,
# packed in parts under 16 MB, in $OUT (training/fetch.sh unpacks them here).
set -euo pipefail
cd "$(dirname "$0")/.."
site=/tmp/flashbar-bench/site
work=/tmp/flashbar-train
export PYTHONPATH=$site PYTHONUNBUFFERED=1
mkdir -p "$work"
# z-lab's dflash (its drafter module) travels as a wheel in .whl/.
if [ -d .whl ] && [ ! -d "$site/dflash" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/dflash-*.whl
fi
python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())'
step=$1; shift
case $step in
  target)
    python3 training/train_target.py "$work" "$@" 2>&1 | tee "$OUT/target.log"
    tar -C "$work" -cf - target-raw train_target.json | split -b 15M - "$OUT/target.tar.part-"
    ;;
  drafter)
    python3 training/train_drafter.py "$work" "$@" 2>&1 | tee "$OUT/drafter.log"
    tar -C "$work" -cf - drafter train_drafter.json | split -b 15M - "$OUT/drafter.tar.part-"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
