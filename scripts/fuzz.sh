#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ one after another, one process each
# (libFuzzer, no sanitizer: the targets are safe Rust; panics, hangs and
# runaway memory are what we look for).
#   scripts/fuzz.sh [SECONDS] [TARGET...]   (default: 60 s, every target)
# New corpus entries go to fuzz/corpus/TARGET (not committed); the seeds in
# fuzz/seeds/TARGET are read too. A crash stops the run with its input in
# fuzz/artifacts/TARGET. Prints run time and exec/s per target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config safetensors chat_request chat_template detokenize)
fi
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

for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  log=$(mktemp)
  echo "== fuzz $target (${seconds} s)"
  started=$(date +%s)
  status=0
  "${fuzz[@]}" run --release --sanitizer none --fuzz-dir fuzz "$target" \
    "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - started ))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "fuzz $target: ${elapsed} s, ${runs:-0} runs, ${speed:-0} exec/s, corpus $(ls "fuzz/corpus/$target" | wc -l)"
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log"
    rm -f "$log"
    echo "fuzz $target failed (input in fuzz/artifacts/$target)" >&2
    exit 1
  fi
  rm -f "$log"
done
