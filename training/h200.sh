#!/usr/bin/env bash
# Device side of the training, on the NVIDIA machine (MLX's CUDA wheel, no
# registry), after scripts/h200-remote.sh has unpacked the pack and the
# Python wheels (mlx, mlx-lm, z-lab's dflash, carried in .whl/):
#   bash training/h200.sh target             step 1 (corpus, tokenizer, target)
#   bash training/h200.sh drafter [ARGS]     step 2 (self-distillation, one drafter)
#   bash training/h200.sh distill SECONDS
#        step 2's self-distillation alone: times the generation under a few
#        MLX settings (training/distill_rate.py), then generates with the
#        fastest until SECONDS from now into $work/sequences.npz; the
#        batch is kept in $work/distill.env for the trainers' cache check
#        (DISTILL_SETTINGS="graphs cudnn batch sync;...", DISTILL_PROBE_SECONDS and DISTILL_RATE_ARGS
#        change what is tried, e.g. for a dry run on the CPU)
#   bash training/h200.sh distill-shards SECONDS SPEC...
#        the same in one process per SPEC side by side on the one GPU (each a
#        shard with its own random streams, each step evaluated before the
#        next; SPEC is the batch, BATCH:nographs with CUDA graphs off; shards
#        are numbered from FIRST_SHARD, default 0, so a later call can add
#        more): the decode steps of this small target are bound by launches
#        and host work, so processes overlap. The trainers read the
#        unsharded sequences.npz and every shard.
#   bash training/h200.sh drafters SECONDS SHAPE...
#        step 2 for several drafter shapes at once on one GPU: the target's
#        continuations are generated once, then one trainer per SHAPE
#        (LAYERS:TAPS, e.g. 2:0,2,4) runs in parallel until SECONDS from now.
#   bash training/h200.sh finetune SHARD INIT TAG [ARGS]
#        a fine-tune in one call: torch_distill.py generates 49,152 sequences
#        of shard SHARD (~61 s), then train_drafter.py --init INIT (a drafter
#        folder) trains drafter-TAG on them for as many steps as fit the
#        deadline (--steps 0: timed on a throwaway drafter first, so the
#        schedule decays before the call ends; the report keeps the count,
#        and --steps N in ARGS repeats it; e.g. --lr 3e-4); other shards' caches in
#        $work are moved to $work/used first, so only the new rows are read
#        (docs/acceptance.md, "Two more fine-tunes"). PROMPT_AT=line draws
#        the prompts as windows ending where a line opens a block
#        (torch_distill.py --prompt-at line) instead of random windows;
#        PROMPT_AT=prose windows ending after a word of a docstring or a
#        comment (--prompt-at prose); PROMPT_AT=window,line,prose splits the
#        49,152 between the kinds, one shard each (SHARD, SHARD + 1, ...),
#        all read by the one fine-tune. SEQUENCES=N generates and reads N
#        instead of 49,152 (on an H100 the taps take ~0.5 ms a sequence with
#        MLX's kernels cached, time the steps then have). The MLX kernel
#        cache goes to $OUT/mlx-ptx.tgz:
#        put it in .jit-cache/ and carry that in the next call.
#        VARIANTS='a:--gamma 2;b:--lr 3e-4' trains drafter-TAG-a and
#        drafter-TAG-b side by side on the same sequences, each with its own
#        ARGS after the call's.
#   bash training/h200.sh accept TAG[,TAG...] [ARGS]
#        bench/acceptance.py on drafter-TAG (or on the folder TAG, where it
#        is one) and on the committed drafter, one
#        after the other in the same call (default --wide --no-reference
#        --repeats 2), their JSON in $OUT: the call after a finetune.
# Each step fits one 10-minute call; outputs land in /tmp/flashbar-train and,
# packed in parts under 16 MB, in $OUT (tar xf of the joined parts unpacks them).
set -euo pipefail
cd "$(dirname "$0")/.."
site=${FLASHBAR_SITE:-/tmp/flashbar-h200/pkg}
work=${FLASHBAR_TRAIN_WORK:-/tmp/flashbar-train}
export PYTHONPATH=$site PYTHONUNBUFFERED=1
mkdir -p "$work"
# Kernel builds kept between calls (training/README.md, "Kernel builds"):
# MLX compiles its fused and JIT kernels with NVRTC on first use (a
# fine-tune's taps and warm-up steps: 330-350 s on an H100) into
# MLX_PTX_CACHE_DIR, and the pack's flashbar its own into
# FLASHBAR_NVRTC_CACHE. A call that carries .jit-cache/ starts from what an
# earlier call left in $OUT (mlx-ptx.tgz from finetune, flashbar-nvrtc.tgz
# and cuda-jit.tgz from accept).
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-$work/mlx-ptx}
export FLASHBAR_NVRTC_CACHE=${FLASHBAR_NVRTC_CACHE:-$work/flashbar-nvrtc}
# and the driver's own, for what is loaded as PTX (docs/gpu.md, "The NVRTC cache")
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$work/cuda-jit}
restore_cache() { # NAME DIR: from this call's .jit-cache/, else what an earlier collect kept
  mkdir -p "$2"
  local from
  for from in .jit-cache /tmp/flashbar-h200/jit-cache; do
    if [ -f "$from/$1.tgz" ]; then
      tar -C "$2" -xzf "$from/$1.tgz"
      echo "kernel cache $1: $(find "$2" -type f | wc -l) files from $from"
      return
    fi
  done
}
save_cache() { # NAME DIR
  tar -C "$2" --exclude='*.cu' -czf "$OUT/$1.tgz" .
}
restore_cache mlx-ptx "$MLX_PTX_CACHE_DIR"
restore_cache flashbar-nvrtc "$FLASHBAR_NVRTC_CACHE"
restore_cache cuda-jit "$CUDA_CACHE_PATH"
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
  distill)
    deadline=$(( $(date +%s) + $1 )); shift
    best_rate=0 best=""
    # CUDA graphs, cuDNN attention, batch, sync (each step evaluated before the
    # next); the first setting also bisects one decode step (distill_rate.py)
    # (a process's first batch costs ~80 s of kernel builds: docs/acceptance.md)
    IFS=';' read -ra settings <<< "${DISTILL_SETTINGS:-1 1 32 1;0 0 256 1}"
    bisect=--bisect
    for setting in "${settings[@]}"; do
      read -r graphs cudnn batch sync <<< "$setting"
      flags=($bisect) bisect=""
      [ "$sync" = 1 ] && flags+=(--sync)
      line=$(cd training && MLX_USE_CUDA_GRAPHS=$graphs MLX_CUDA_USE_CUDNN_SDPA=$cudnn \
        timeout "${DISTILL_PROBE_SECONDS:-150}" python3 distill_rate.py --batch "$batch" "${flags[@]}" ${DISTILL_RATE_ARGS:-} 2>&1 \
        | tee -a "$OUT/distill_rate.log" | grep -E '^(RATE|BISECT)' || true)
      echo "graphs=$graphs cudnn=$cudnn batch=$batch sync=$sync: ${line:-failed}"
      rate=$(sed -n 's/^RATE.*seq_per_s=\([0-9.]*\).*/\1/p' <<< "$line")
      if [ -n "$rate" ] && python3 -c "import sys; sys.exit(not $rate > $best_rate)"; then
        best_rate=$rate best="$setting"
      fi
    done
    [ -n "$best" ] || { echo "no setting could distill" >&2; exit 1; }
    read -r graphs cudnn batch sync <<< "$best"
    echo "DISTILL_BATCH=$batch" > "$work/distill.env"
    echo "distilling with $best ($best_rate sequences/s)"
    sync_flag=()
    [ "$sync" = 1 ] && sync_flag=(--distill-sync)
    MLX_USE_CUDA_GRAPHS=$graphs MLX_CUDA_USE_CUDNN_SDPA=$cudnn python3 training/train_drafter.py \
      "$work" --distill-only --distill-batch "$batch" "${sync_flag[@]}" --deadline "$deadline" ${FLASHBAR_TRAIN_ARGS:-} \
      2>&1 | tee "$work/distill.log" "$OUT/distill.log"
    ;;
  distill-shards)
    # distill-shards SECONDS SPEC...: one process per SPEC, shard K = FIRST_SHARD + its
    # index; SPEC is a batch, `BATCH:nographs` runs it with CUDA graphs off.
    deadline=$(( $(date +%s) + $1 )); shift
    first=${FIRST_SHARD:-0}
    # The prompts once, before the processes that read them start.
    python3 training/train_drafter.py "$work" --corpus-only ${FLASHBAR_TRAIN_ARGS:-}
    pids=() k=$first
    for spec in "$@"; do
      batch=${spec%%:*} graphs=1
      [ "$spec" != "${spec%:nographs}" ] && graphs=0
      MLX_USE_CUDA_GRAPHS=$graphs python3 training/train_drafter.py "$work" --distill-only --distill-sync \
        --distill-batch "$batch" --shard "$k" --deadline "$deadline" ${FLASHBAR_TRAIN_ARGS:-} \
        > "$work/distill-$k.log" 2>&1 &
      pids+=($!) k=$((k + 1))
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
    specs=("$@")
    for i in "${!specs[@]}"; do
      echo "== shard $((first + i)) (${specs[$i]})"
      grep -v '^distill: batch' "$work/distill-$((first + i)).log" | tail -3
    done
    cat "$work"/distill-*.log > "$OUT/distill.log"
    # A shard that failed leaves no file; the others are kept and read.
    [ "$failed" -lt $# ] || { echo "every shard failed" >&2; exit 1; }
    ;;
  drafters)
    deadline=$(( $(date +%s) + $1 )); shift
    distill_batch=()
    if [ -f "$work/distill.env" ]; then
      # shellcheck disable=SC1091
      . "$work/distill.env"
      distill_batch=(--distill-batch "$DISTILL_BATCH")
    fi
    python3 training/train_drafter.py "$work" --distill-only "${distill_batch[@]}" ${FLASHBAR_TRAIN_ARGS:-} 2>&1 | tee -a "$work/distill.log"
    pids=() names=()
    for shape in "$@"; do
      layers=${shape%%:*} taps=${shape#*:} tag="l${shape%%:*}-t${taps//,/}"
      python3 training/train_drafter.py "$work" --layers "$layers" --taps "$taps" --tag "$tag" \
        --deadline "$deadline" "${distill_batch[@]}" ${FLASHBAR_TRAIN_ARGS:-} > "$work/$tag.log" 2>&1 &
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
  finetune)
    shard=$1 init=$2 tag=$3; shift 3
    began=$(date +%s)
    IFS=',' read -ra kinds <<< "${PROMPT_AT:-window}"
    sequences=${SEQUENCES:-49152}
    per_kind=$((sequences / ${#kinds[@]}))
    mkdir -p "$work/used"
    for cache in "$work"/sequences*.npz; do
      [ -e "$cache" ] || continue
      keep=0
      for i in "${!kinds[@]}"; do
        [ "$cache" = "$work/sequences-shard-$((shard + i)).npz" ] && keep=1
      done
      [ "$keep" = 1 ] || mv "$cache" "$work/used/"
    done
    for i in "${!kinds[@]}"; do
      # a shard this machine already made (an earlier call while it stayed warm) is kept
      held=$(python3 -c 'import sys, numpy as np
try: print(len(np.load(sys.argv[1])["sequences"]))
except OSError: print(0)' "$work/sequences-shard-$((shard + i)).npz")
      if [ "$held" -ge "$per_kind" ]; then
        echo "shard $((shard + i)): $held sequences already here"
        continue
      fi
      (cd training && python3 torch_distill.py "$work" --shard $((shard + i)) --sequences "$per_kind" --batch 4096 \
        --prompt-at "${kinds[$i]}" --deadline $((began + 130))) 2>&1 | tail -3
    done
    # VARIANTS='a:ARGS;b:ARGS': one trainer per variant, side by side on the
    # one GPU (a step of this drafter, ~27 ms on an H100 for ~0.5 TFLOP, 1-2
    # ms at the GPU's bf16 rate, is bound by its launches; three side by side
    # ran at 62-64 ms each), drafter-TAG-a
    # with ARGS after the call's own; unset, one trainer, drafter-TAG.
    # Side by side, each times its steps once all are ready (--side-by-side).
    IFS=';' read -ra variants <<< "${VARIANTS:-:}"
    pids=() tags=() together=()
    if [ ${#variants[@]} -gt 1 ]; then
      rm -rf "$work/side-by-side-$tag"
      together=(--side-by-side "$work/side-by-side-$tag:${#variants[@]}")
    fi
    for variant in "${variants[@]}"; do
      name=${variant%%:*} extra=${variant#*:}
      one=$tag${name:+-$name}
      # shellcheck disable=SC2086
      python3 training/train_drafter.py "$work" --init "$init" --tag "$one" --lr 5e-4 --tap-batch 512 \
        --sequences "$sequences" --steps 0 --deadline $((began + 570)) "${together[@]}" "$@" $extra \
        > "$OUT/drafter-$one.log" 2>&1 &
      pids+=($!) tags+=("$one")
    done
    status=0 files=()
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "${tags[$i]} failed"; status=1; }; done
    for one in "${tags[@]}"; do
      echo "== $one"; tail -5 "$OUT/drafter-$one.log"
      [ -d "$work/drafter-$one" ] && files+=("drafter-$one" "train_drafter-$one.json")
    done
    [ ${#files[@]} -eq 0 ] || tar -C "$work" -cf - "${files[@]}" | split -b 15M - "$OUT/drafters.tar.part-"
    save_cache mlx-ptx "$MLX_PTX_CACHE_DIR"
    exit $status
    ;;
  accept)
    # accept TAG[,TAG...] [ARGS]: bench/acceptance.py (--wide --no-reference
    # --repeats 2 unless ARGS say otherwise) on each drafter-TAG, then on the committed drafter,
    # in the same call, with the pack's flashbar; JSON of each in $OUT.
    IFS=',' read -ra tags <<< "$1"; shift
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(--wide --no-reference --repeats 2)
    drafters=()
    # a TAG that is a folder (a drafter the call carried, e.g. from .drafters/) is taken as it is
    for tag in "${tags[@]}"; do
      if [ -d "$tag" ]; then drafters+=("$tag"); else drafters+=("$work/drafter-$tag"); fi
    done
    for drafter in "${drafters[@]}" models/default/drafter; do
      name=$(basename "$drafter")
      [ "$drafter" = models/default/drafter ] && name=committed
      echo "== $name"
      python3 bench/acceptance.py --flashbar "$site/flashbar" --drafter "$drafter" "${args[@]}" \
        --json "$OUT/acceptance-$name.json" 2>&1 | tail -12
    done
    save_cache flashbar-nvrtc "$FLASHBAR_NVRTC_CACHE"
    save_cache cuda-jit "$CUDA_CACHE_PATH"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
