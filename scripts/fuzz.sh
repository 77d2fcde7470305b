#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ one after another, one process each
# (libFuzzer, no sanitizer: the targets are safe Rust; panics, hangs and
# runaway memory are what we look for).
#
#   scripts/fuzz.sh --ci [TARGET...]        the test suite's step: the same
#                                           work and answer on every machine
#   scripts/fuzz.sh [SECONDS] [TARGET...]   exploratory (default 60 s each)
#
# --ci first replays every committed input (git ls-files fuzz/seeds/TARGET
# fuzz/corpus/TARGET), each once, then fuzzes from those alone with a fixed
# -seed for a fixed number of runs (ci_runs below), into a throwaway corpus:
# no clock, no local corpus, so a clean clone does the same work anywhere.
# The replay is exact; the fuzzing is not bit-for-bit (coverage varies a
# little between processes), so commit any crash it finds as a seed.
#
# Exploratory mode fuzzes for SECONDS per target from a fresh random seed;
# new corpus entries go to fuzz/corpus/TARGET (not committed), and the seeds
# in fuzz/seeds/TARGET are read too. Run it for 10 minutes a target whenever
# a parser changes; commit each crash it finds as a seed with its fix.
#
# A crash stops the run with its input in fuzz/artifacts/TARGET (where
# libFuzzer could write one). Prints run time, runs and exec/s per target.
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(config safetensors chat_request chat_template detokenize)
# Fuzzing runs per target in --ci mode, sized so that the whole step takes
# a few minutes on 2 shared cores (measured speeds are in fuzz/README.md).
declare -A ci_runs=(
  [config]=1000000
  [safetensors]=1500000
  [chat_request]=1000000
  [chat_template]=20000
  [detokenize]=10000
)
ci_seed=1

mode=explore
seconds=60
if [ "${1:-}" = --ci ]; then
  mode=ci
  shift
elif [ $# -gt 0 ]; then
  case "$1" in
    '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, not '$1'" >&2; exit 2 ;;
  esac
  seconds=$1
  shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=("${all_targets[@]}")
fi
for target in "${targets[@]}"; do
  if [ ! -f "fuzz/fuzz_targets/$target.rs" ]; then
    echo "fuzz.sh: no fuzz target '$target' (targets: ${all_targets[*]})" >&2
    exit 2
  fi
done
# cargo-fuzz needs nightly (scripts/setup.sh installs both).
fuzz=(cargo +nightly fuzz)

for target in "${targets[@]}"; do
  "${fuzz[@]}" build --release --sanitizer none --fuzz-dir fuzz "$target"
done

# cargo-fuzz sets its own RUSTFLAGS, which replace the workspace's rpath to
# libmlx.so (.cargo/config.toml): point the loader at the MLX wheel instead.
build_dir="${CARGO_TARGET_DIR:-fuzz/target}/$(rustc -vV | sed -n 's/^host: //p')/release"
mlx_lib=$(find "$build_dir/mlx-wheels" -name libmlx.so -path '*/mlx/lib/*' | head -n 1)
export LD_LIBRARY_PATH="$(dirname "$(realpath "$mlx_lib")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

common=(-timeout=30 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1)

# What a finished or crashed libFuzzer log says it ran: "RUNS EXEC_PER_S".
# The final stats are missing when the process died on a signal libFuzzer
# could not handle (a stack overflow): then the last progress line counts.
ran() {
  local log=$1 runs speed
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
  if [ -z "$runs" ]; then
    runs=$(grep -o '^#[0-9]*' "$log" | tr -d '#' | tail -n 1 || true)
    speed=$(grep -o 'exec/s: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
    runs="at least ${runs:-0}"
  fi
  echo "$runs runs, ${speed:-0} exec/s"
}

# Why a run failed, in words, from its exit status and log.
why() {
  local status=$1 log=$2
  if grep -q 'has overflowed its stack' "$log"; then
    echo "stack overflow"
  elif grep -q 'deadly signal\|panicked at' "$log"; then
    echo "crash (panic or abort)"
  elif grep -q 'ERROR: libFuzzer: timeout' "$log"; then
    echo "timeout"
  elif grep -q 'out-of-memory' "$log"; then
    echo "out of memory"
  elif [ "$status" -gt 128 ]; then
    echo "killed by SIG$(kill -l $((status - 128)) 2>/dev/null || echo $((status - 128)))"
  else
    echo "exit status $status"
  fi
}

fail() {
  local target=$1 status=$2 log=$3
  tail -n 40 "$log"
  echo "fuzz $target failed: $(why "$status" "$log"); $(ran "$log") (input in fuzz/artifacts/$target when libFuzzer could write one)" >&2
  rm -f "$log"
  exit 1
}

for target in "${targets[@]}"; do
  log=$(mktemp)
  started=$(date +%s)
  status=0
  if [ "$mode" = ci ]; then
    mapfile -t committed < <(git ls-files "fuzz/seeds/$target" "fuzz/corpus/$target")
    echo "== fuzz $target (replay ${#committed[@]} committed inputs, then -seed=$ci_seed -runs=${ci_runs[$target]})"
    # Replay: given files, libFuzzer runs each once and stops.
    if [ ${#committed[@]} -gt 0 ]; then
      "${fuzz[@]}" run --release --sanitizer none --fuzz-dir fuzz "$target" \
        "${committed[@]}" -- "${common[@]}" >"$log" 2>&1 || status=$?
      if [ "$status" -ne 0 ]; then fail "$target" "$status" "$log"; fi
      replayed=$(grep -c '^Executed ' "$log" || true)
      if [ "$replayed" -ne ${#committed[@]} ]; then
        tail -n 20 "$log"
        echo "fuzz $target: replayed $replayed of ${#committed[@]} inputs" >&2
        exit 1
      fi
    fi
    # Fuzz from the committed seeds alone, into a throwaway corpus.
    scratch=$(mktemp -d)
    "${fuzz[@]}" run --release --sanitizer none --fuzz-dir fuzz "$target" \
      "$scratch" "fuzz/seeds/$target" -- "${common[@]}" \
      -seed="$ci_seed" -runs="${ci_runs[$target]}" >"$log" 2>&1 || status=$?
    rm -rf "$scratch"
  else
    mkdir -p "fuzz/corpus/$target"
    echo "== fuzz $target (${seconds} s)"
    "${fuzz[@]}" run --release --sanitizer none --fuzz-dir fuzz "$target" \
      "fuzz/corpus/$target" "fuzz/seeds/$target" -- "${common[@]}" \
      -max_total_time="$seconds" >"$log" 2>&1 || status=$?
  fi
  elapsed=$(( $(date +%s) - started ))
  if [ "$status" -ne 0 ]; then fail "$target" "$status" "$log"; fi
  corpus=""
  if [ "$mode" = explore ]; then corpus=", corpus $(ls "fuzz/corpus/$target" | wc -l)"; fi
  echo "fuzz $target: ${elapsed} s, $(ran "$log")${corpus}"
  rm -f "$log"
done
