#!/usr/bin/env bash
# Packs what bench/vs_mlx_lm.py needs on the NVIDIA machine (no Rust, no
# registry there): the CUDA build of `flashbar`, small fixture pairs, and the wheels of mlx,
# mlx-cuda-13 and mlx-lm 0.32.2 and z-lab's dflash for its Python 3.12, split into parts that
# fit one device call each (.h200/bench-part-*). bench/h200-run.sh is the
# device side: call it once per part, `run` on the last call.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="-C link-arg=-Wl,-rpath,\$ORIGIN/mlx/lib:\$ORIGIN/../mlx/lib -C link-arg=-Wl,--allow-shlib-undefined"
CARGO_TARGET_DIR=target/cuda cargo build --release --features cuda -p flashbar-cli
stage=.h200/bench-stage
rm -rf .h200/bench-* && mkdir -p "$stage"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_35_x86_64 -d "$stage" \
  mlx==0.32.2 mlx-cuda-13==0.32.2 mlx-lm==0.32.2 dflash==0.1.0
cp target/cuda/release/flashbar "$stage/" && strip "$stage/flashbar"
# Small fixture pairs for the GPU lossless check (bench/lossless_check.py).
mkdir -p "$stage/fixtures"
for f in dense-mlx-4bit moe-mlx-4bit drafter-dense-f32 drafter-sliding-f32; do
  cp -r "target/fixtures/$f" "$stage/fixtures/"
done
tar -C "$stage" -cf .h200/bench.tar .
rm -rf "$stage"
# 30 MiB parts: each call carries the 26 MB working tree too (64 MiB in all).
(cd .h200 && split -b 30M bench.tar bench-part- && rm bench.tar)
ls -la .h200
