#!/usr/bin/env bash
# Device side of the training, on the NVIDIA machine (MLX's CUDA wheel, no
# registry), after scripts/h200-remote.sh has unpacked the pack and the
# Python wheels (mlx, mlx-lm, z-lab's dflash, carried in .whl/):
#   bash training/h200.sh target             step 1 (corpus, tokenizer, target)
#   bash training/h200.sh drafter [ARGS]     step 2 (self-distillation, one drafter)
#   bash training/h200.sh drafters SECONDS SHAPE...
#        step 2 for several drafter shapes at once on one GPU: the target's
#        continuations are generated once, then one trainer per SHAPE
#        (LAYERS:TAPS, e.g. 2:0,2,4) runs in parallel until SECONDS from now.
# Each step fits one 10-minute call; outputs land in /tmp/flashbar-train and,
# packed in parts under 16 MB, in $OUT (tar xf of the joined parts unpacks them).
set -euo pipefail
cd "$(dirname "$0")/.."
site=${FLASHBAR_SITE:-/tmp/flashbar-h200/pkg}
work=${FLASHBAR_TRAIN_WORK:-/tmp/flashbar-train}
export PYTHONPATH=$site PYTHONUNBUFFERED=1
mkdir -p "$work"
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
  drafters)
    deadline=$(( $(date +%s) + $1 )); shift
    python3 training/train_drafter.py "$work" --distill-only ${FLASHBAR_TRAIN_ARGS:-} 2>&1 | tee "$work/distill.log"
    pids=() names=()
    for shape in "$@"; do
      layers=${shape%%:*} taps=${shape#*:} tag="l${shape%%:*}-t${taps//,/}"
      python3 training/train_drafter.py "$work" --layers "$layers" --taps "$taps" --tag "$tag" \
        --deadline "$deadline" ${FLASHBAR_TRAIN_ARGS:-} > "$work/$tag.log" 2>&1 &
      pids+=($!) names+=("$tag")
    done
    status=0
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "${names[$i]} failed"; status=1; }; done
    for tag in "${names[@]}"; do echo "== $tag"; tail -4 "$work/$tag.log"; done
    files=(distill.log)
    for tag in "${names[@]}"; do
      files+=("$tag.log")
      [ -d "$work/drafter-$tag" ] && files+=("drafter-$tag" "train_drafter-$tag.json")
    done
    tar -C "$work" -cf - "${files[@]}" | split -b 15M - "$OUT/drafters.tar.part-"
    exit $status
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
