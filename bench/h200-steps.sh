#!/usr/bin/env bash
# Device side, after scripts/h200-remote.sh has collected the pack's parts:
# named benchmark steps run in one call, each under its own time limit, their
# output in $OUT (docs/gpu.md, "Measuring on the GPU").
#   bash bench/h200-steps.sh unpack gdn vs9b accept ...
# Steps: unpack, gdn (the gated-delta layer kernel checked and timed),
# vs9b (9B shape vs mlx-lm at 1,024 tokens, $ALSO as a column of ours),
# round (a DFlash round at 1,024 and 8,192 tokens, ours and with $ALSO),
# counts (kernels of a step and of a forced DFlash round, in order too),
# sequence (a round's kernels in order), ab (rounds at 1,024 tokens, ours
# and $ALSO in turn, twice), peak (a prefill's peak memory stepwise), accept (the embedded pair:
# lossless, forced and auto; accept-also: the same with $ALSO; gatelog: the same with the
# gate's shadow probes logged), repeat35 (a prefill three times: where it first differs, ours, by MLX's ops, mlx-lm's), vs35 and counts35 (the 35B-A3B shape: vs mlx-lm with $ALSO,
# kernels a step with $ALSO; round35: its DFlash round and lossless check; sequence35: its
# round's kernels and a step's in order, each timed, with the first $ALSO), smoke,
# steptime (a decode step's kernels timed one by one, 9B and 35B-A3B), ckpt35 (the 35B-A3B
# checkpoint alone), hostpart (a step's host part beside the whole, flashbar bench --verify-cost),
# repeat9 (the 9B's 8,192-token prefill repeated with each default turned off in turn),
# prefillfix (the prefill's products in our kernel and in MLX's: repeated, timed; smoke),
# round8k (the 9B's DFlash round at 8,192 tokens, three times, and once with $ALSO),
# hostab (the 35B-A3B's host part, ours and $ALSO in turn), hostab9 (the same for the 9B), smoke-also (smoke with $ALSO), hostcost (one call's host cost by kind: bench/host_cost.py),
# gdnprof (the gated-delta layer kernel under Nsight Compute at T = 1 and 16),
# tune (bench/qmm_tune.py --dependent at the 9B's decode shapes, the stacked maps' included),
# save (kernel caches).
# ALSO: environment settings to compare (default FLASHBAR_SPLIT_PARTS=0); several
# columns separated by ';' (vs9b, vs35 and round35 run each, the other steps the first).
set -uo pipefail
cd "$(dirname "$0")/.."
pkg=/tmp/flashbar-h200/pkg
bin=$pkg/flashbar
export PYTHONPATH=$pkg PYTHONUNBUFFERED=1 MLX_CUDA_GRAPH_CACHE_SIZE=4000
export MLX_PTX_CACHE_DIR=/tmp/fb/mlx-ptx FLASHBAR_NVRTC_CACHE=/tmp/fb/nvrtc CUDA_CACHE_PATH=/tmp/fb/cuda-jit
nine=target/bench/qwen3.5-9b-4bit
IFS=';' read -ra also_specs <<< "${ALSO:-FLASHBAR_SPLIT_PARTS=0}"
also=${also_specs[0]}
also_args=()
for spec in "${also_specs[@]}"; do also_args+=(--also "$spec"); done
restore() { # NAME DIR
  [ -d "$2" ] && return
  mkdir -p "$2"
  for from in .jit-cache /tmp/flashbar-h200/jit-cache; do
    if [ -f "$from/$1.tgz" ]; then tar -C "$2" -xzf "$from/$1.tgz"; return; fi
  done
}
run() { # SECONDS NAME CMD...: output to $OUT/NAME.txt, its tail here
  local limit=$1 name=$2 started=$SECONDS
  shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "exit $? in $((SECONDS - started)) s"
  tail -"${TAIL:-14}" "$OUT/$name.txt"
}
for step in "$@"; do
  case $step in
    unpack)
      bash scripts/h200-remote.sh collect unpack > /dev/null
      restore mlx-ptx "$MLX_PTX_CACHE_DIR"
      restore flashbar-nvrtc "$FLASHBAR_NVRTC_CACHE"
      restore cuda-jit "$CUDA_CACHE_PATH"
      ;;
    gdn)
      run 200 gdn python3 bench/gpu_kernels.py --gdn-only ${GDN_OLD:+--gdn-old "$GDN_OLD"} \
        ${GDN_REPLAY_OLD:+--gdn-replay-old "$GDN_REPLAY_OLD"}
      grep -c '"ok": true' "$OUT/gdn.txt"; grep '"ok": false' "$OUT/gdn.txt" | head -5
      ;;
    vs9b)
      run 300 vs9b python3 bench/vs_mlx_lm.py --flashbar "$bin" --shape qwen3.5-9b \
        --prompt-tokens 1024 --exact-prompt --bandwidth 2830 "${also_args[@]}"
      ;;
    round)
      run 200 round python3 bench/dflash_round.py --flashbar "$bin" --dir "$nine" --no-reference
      run 200 round-also env ${also//,/ } python3 bench/dflash_round.py --flashbar "$bin" --dir "$nine" \
        --no-reference
      ;;
    counts)
      run 200 counts python3 bench/launch_counts.py --flashbar "$bin" --model "$nine" \
        --dflash target/bench/qwen3.5-9b-4bit-drafter5 --also "$also" --sequence
      ;;
    steptime)
      # a plain decode step's kernels in order, each timed alone, 9B then 35B-A3B
      [ -d "$nine" ] && run 200 steptime python3 bench/launch_counts.py --flashbar "$bin" \
        --model "$nine" --sequence
      run 200 steptime35 python3 bench/launch_counts.py --flashbar "$bin" \
        --model target/bench/qwen3.6-35b-a3b-4bit --sequence
      ;;
    tune)
      # every (tiles, warps) launch of our matmul at the 9B's decode shapes
      # (o_proj, down, lm_head and the three stacked maps), chained and in
      # dependent chains, beside MLX's: the launch rule's next revision
      run 500 tune python3 bench/qmm_tune.py --dependent --only 2 4 5 11 12 13
      ;;
    gdnprof)
      # the gated-delta layer kernel under Nsight Compute, one call at T = 1
      # and one at 16, a thread a state row and four: where its time goes
      # (stall reasons, memory, occupancy)
      for split in 1 4; do
        for t in 1 16; do
          run 200 "gdnprof$t-split$split" ncu --clock-control none --kernel-name regex:gdn_layer \
            --launch-skip 4 --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section SchedulerStats \
            --section MemoryWorkloadAnalysis --section SourceCounters \
            python3 bench/gpu_kernels.py --gdn-profile "$t" --gdn-split "$split"
        done
      done
      ;;
    sequence)
      run 200 sequence python3 bench/launch_counts.py --flashbar "$bin" --model "$nine" \
        --dflash target/bench/qwen3.5-9b-4bit-drafter5 --sequence
      ;;
    ab)
      # ours and $ALSO in turn, twice each, at 1,024 tokens (a noisy machine)
      for i in 1 2; do
        TAIL=3 run 100 "ab-ours-$i" python3 bench/dflash_round.py --flashbar "$bin" --dir "$nine" \
          --no-reference --contexts 1024
        TAIL=3 run 100 "ab-also-$i" env ${also//,/ } python3 bench/dflash_round.py --flashbar "$bin" \
          --dir "$nine" --no-reference --contexts 1024
      done
      ;;
    peak)
      run 200 peak "$pkg/prefill_peak" "$nine" --stepwise 256 1024
      run 200 peak-whole "$pkg/prefill_peak" "$nine" 1024
      ;;
    repeat35)
      # the 35B-A3B's prefill three times: the first layer whose output differs,
      # ours, ours with MLX's gather_qmm (the ops), and mlx-lm's forward
      run 200 repeat35 "$pkg/prefill_repeat" target/bench/qwen3.6-35b-a3b-4bit 1024 3
      run 200 repeat35-ops env FLASHBAR_MOE_PREFILL_KERNELS=0 "$pkg/prefill_repeat" \
        target/bench/qwen3.6-35b-a3b-4bit 1024 3
      run 300 repeat35-mlx-lm python3 bench/prefill_repeat_mlx_lm.py target/bench/qwen3.6-35b-a3b-4bit 1024 3
      ;;
    repeat9)
      # the 9B's 8,192-token prefill three times from fresh caches, per setting, twice each
      # (docs/gpu.md, "The attention's head in one kernel"; our products, head kernel and gate
      # in the merge are the defaults, each turned off by its setting =0)
      [ -d "$nine" ] || python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path
import vs_mlx_lm as v; v.write_checkpoint(Path('$nine'), v.SHAPES['qwen3.5-9b'])"
      for setting in NONE=1 FLASHBAR_PREFILL_QMM=0 FLASHBAR_ATTN_HEAD_KERNEL=0 \
          FLASHBAR_ATTN_GATE_IN_MERGE=0 MLX_CUDA_USE_CUDNN_SDPA=0; do
        for i in 1 2; do
          echo "== $setting ($i)" | tee -a "$OUT/repeat9.txt"
          env $setting timeout 60 "$pkg/prefill_repeat" "$nine" 8192 3 2>&1 | tail -2 | tee -a "$OUT/repeat9.txt"
        done
      done
      ;;
    prefillfix)
      # a prefill's products through our kernel (the default, in 64-row tiles;
      # FLASHBAR_PREFILL_TILE=32: 32-row tiles) against MLX's (FLASHBAR_PREFILL_QMM=0): MLX's
      # ops alone repeated at the 9B's shapes, the 9B's 8,192-token prefill repeated and timed
      # each way, then smoke (qmm_prefill_rows_invariant, both tiles)
      [ -d "$nine" ] || python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path
import vs_mlx_lm as v; v.write_checkpoint(Path('$nine'), v.SHAPES['qwen3.5-9b'])"
      run 90 repeat-ops python3 bench/repeat_ops.py --tokens 8192 --repeats 6
      for setting in NONE=1 FLASHBAR_PREFILL_TILE=32 FLASHBAR_PREFILL_QMM=0 NONE=1 \
          FLASHBAR_PREFILL_TILE=32; do
        echo "== $setting" | tee -a "$OUT/prefillfix.txt"
        env $setting timeout 60 "$pkg/prefill_repeat" "$nine" 8192 5 2>&1 | tail -10 | tee -a "$OUT/prefillfix.txt"
      done
      run 200 smoke "$bin" smoke
      ;;
    round8k)
      # the 9B's DFlash round at 8,192 tokens, its lossless line, three times with the
      # defaults and once with $ALSO (docs/gpu.md, "A prefill's products in the kernel")
      for setting in NONE=1 NONE=2 NONE=3 "${also//,/ }"; do
        echo "== $setting" | tee -a "$OUT/round8k.txt"
        env $setting timeout 90 python3 bench/dflash_round.py --flashbar "$bin" --dir "$nine" \
          --no-reference --contexts 8192 2>&1 | grep -E '^ +[0-9]+ [|]|lossless [(]' | tee -a "$OUT/round8k.txt"
      done
      ;;
    hostpart)
      # a decode step's and a verify's host part (graph built and queued) beside the whole, 35B-A3B then 9B
      run 200 hostpart35 "$bin" bench --model target/bench/qwen3.6-35b-a3b-4bit --verify-cost \
        --block 16 --context-tokens 1024 --repeats 10
      [ -d "$nine" ] && run 200 hostpart "$bin" bench --model "$nine" --verify-cost --block 16 \
        --context-tokens 1024 --repeats 10
      ;;
    hostab)
      # the 35B-A3B's decode step and verify, host part beside the whole, ours and $ALSO in
      # turn, twice (flashbar bench --verify-cost; a change to a call's host cost)
      for i in 1 2; do
        for setting in NONE=1 "${also//,/ }"; do
          echo "== $setting ($i)" | tee -a "$OUT/hostab.txt"
          env $setting timeout 120 "$bin" bench --model target/bench/qwen3.6-35b-a3b-4bit --verify-cost \
            --block 16 --context-tokens 1024 --repeats 10 2>&1 | tail -6 | tee -a "$OUT/hostab.txt"
        done
      done
      ;;
    hostab9)
      # the 9B's decode step and verify, host part beside the whole, ours and $ALSO in
      # turn, twice (as hostab; the 9B's checkpoint is written in seconds)
      python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path
import vs_mlx_lm as v; p = Path('$nine')
p.exists() or v.write_checkpoint(p, v.SHAPES['qwen3.5-9b'])"
      for i in 1 2; do
        for setting in NONE=1 "${also//,/ }"; do
          echo "== $setting ($i)" | tee -a "$OUT/hostab9.txt"
          env $setting timeout 100 "$bin" bench --model "$nine" --verify-cost \
            --block 16 --context-tokens 1024 --repeats 10 2>&1 | tail -6 | tee -a "$OUT/hostab9.txt"
        done
      done
      ;;
    ckpt35)
      # the 35B-A3B's random checkpoint alone (round35 and vs35 write it too)
      run 200 ckpt35 python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path
import vs_mlx_lm as v; p = Path('target/bench/qwen3.6-35b-a3b-4bit')
p.exists() or v.write_checkpoint(p, v.SHAPES['qwen3.6-35b-a3b'])"
      ;;
    accept)
      run 200 accept python3 bench/acceptance.py --flashbar "$bin" --no-reference \
        --max-tokens 96 --repeats 2 --json "$OUT/accept.json"
      ;;
    accept-also)
      run 200 accept-also env ${also//,/ } python3 bench/acceptance.py --flashbar "$bin" \
        --no-reference --max-tokens 96 --repeats 2 --json "$OUT/accept-also.json"
      ;;
    gatelog)
      # auto's shadow probes, a line each (docs/dflash.md, "Shadow probes")
      run 200 gatelog env RUST_LOG=flashbar_engine=debug python3 bench/acceptance.py --flashbar "$bin" \
        --no-reference --max-tokens 96 --repeats 2 --json "$OUT/gatelog.json" --stderr "$OUT/gatelog"
      grep -c "shadow probe" "$OUT"/gatelog.*.txt
      ;;
    vs35)
      run 400 vs35 python3 bench/vs_mlx_lm.py --flashbar "$bin" --shape qwen3.6-35b-a3b \
        --prompt-tokens 1024 --exact-prompt --bandwidth 2830 --repeats 2 --max-tokens 64 "${also_args[@]}"
      ;;
    round35)
      # the 35B-A3B's DFlash round, with its lossless check, ours and with $ALSO
      run 300 round35 python3 bench/dflash_round.py --flashbar "$bin" --shape qwen3.6-35b-a3b --no-reference --contexts 1024
      for i in "${!also_specs[@]}"; do
        spec=${also_specs[$i]}
        run 200 "round35-also$i" env ${spec//,/ } python3 bench/dflash_round.py --flashbar "$bin" \
          --shape qwen3.6-35b-a3b --no-reference --contexts 1024
      done
      ;;
    sequence35)
      # the 35B-A3B's DFlash round's kernels in order, each timed alone (after round35,
      # which writes its drafter), then a decode step's (docs/gpu.md, "Left to do")
      run 300 sequence35 env ${also//,/ } python3 bench/launch_counts.py --flashbar "$bin" \
        --model target/bench/qwen3.6-35b-a3b-4bit \
        --dflash target/bench/qwen3.6-35b-a3b-4bit-drafter5 --sequence
      run 200 steptime35 env ${also//,/ } python3 bench/launch_counts.py --flashbar "$bin" \
        --model target/bench/qwen3.6-35b-a3b-4bit --sequence
      ;;
    counts35)
      run 200 counts35 python3 bench/launch_counts.py --flashbar "$bin" \
        --model target/bench/qwen3.6-35b-a3b-4bit --also "$also"
      ;;
    smoke)
      # a cold first run (no kernel caches) took more than 300 s on an H200
      run 500 smoke "$bin" smoke
      ;;
    smoke-also)
      run 500 smoke-also env ${also//,/ } "$bin" smoke
      ;;
    hostcost)
      # what one call costs the host, by kind of call (docs/gpu.md, "What a call costs the host, by kind")
      run 120 hostcost python3 bench/host_cost.py
      ;;
    save)
      tar -C "$MLX_PTX_CACHE_DIR" -czf "$OUT/mlx-ptx.tgz" .
      tar -C "$FLASHBAR_NVRTC_CACHE" --exclude='*.cu' -czf "$OUT/flashbar-nvrtc.tgz" .
      tar -C "$CUDA_CACHE_PATH" -czf "$OUT/cuda-jit.tgz" .
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
