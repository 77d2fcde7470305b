#!/usr/bin/env bash
# Builds `flashbar` against MLX's CUDA wheel (cargo feature `cuda`) and packs
# it with the wheel's libraries for an NVIDIA machine that has no Rust and no
# registry: .h200/flashbar-cuda.tar.xz, split into 30 MiB parts (one device
# call carries at most 64 MiB). scripts/h200-remote.sh is the device side.
#
# The binary's rpath is $ORIGIN/mlx/lib and libmlx's own RPATH names
# ../../nvidia, so the pack works from any folder once `nvidia` (the CUDA 13
# nvidia-* wheels, e.g. torch's) is linked beside it.
#
# Also downloads into .whl/ the Python 3.12 wheels the device's training and
# reference runs need (mlx's bindings, mlx-lm, z-lab's dflash): carry .whl in
# the call that unpacks. `--no-binary` packs only the wheel's libraries (no
# Rust build), enough for training/h200.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
target=target/cuda
stage=.h200/stage
rm -rf .h200 && mkdir -p "$stage"
if [ "${1:-}" = --no-binary ]; then
  wheel="${XDG_CACHE_HOME:-$HOME/.cache}/flashbar/wheels/mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl"
  [ -f "$wheel" ] || { echo "no $wheel: run FLASHBAR_CUDA=1 scripts/setup.sh" >&2; exit 1; }
  python3 -m zipfile -e "$wheel" "$stage"
  rm -rf "$stage"/*.dist-info
else
  # The nvidia libraries libmlx needs exist only on the GPU machine.
  export RUSTFLAGS="-C link-arg=-Wl,-rpath,\$ORIGIN/mlx/lib:\$ORIGIN/../mlx/lib -C link-arg=-Wl,--allow-shlib-undefined"
  CARGO_TARGET_DIR=$target cargo build --release --features cuda -p flashbar-cli
  profile=$target/release
  cp "$profile/flashbar" "$stage/"
  strip "$stage/flashbar"
  # A prefill's memory by prompt length (docs/gpu.md, "Left to do"), and
  # whether it gives the same bits twice ("Same prompt, same answer").
  CARGO_TARGET_DIR=$target cargo build --release --features flashbar-mlx/cuda -p flashbar-models \
    --example prefill_peak --example prefill_repeat
  for example in prefill_peak prefill_repeat; do
    cp "$profile/examples/$example" "$stage/"
    strip "$stage/$example"
  done
  cp -rL "$profile/mlx" "$stage/mlx"
  cp -rL "$profile/mlx_cuda_13.libs" "$stage/"
fi
# mlx/include stays: the CUDA backend JIT-compiles kernels against those headers.
rm -rf "$stage/mlx/share"
strip "$stage/mlx/lib/libmlx.so"
rm -rf .whl && python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_35_x86_64 -d .whl mlx==0.32.2 mlx-lm==0.32.2 dflash==0.1.0
tar -C "$stage" -cf - . | xz -T2 -6 > .h200/flashbar-cuda.tar.xz
rm -rf "$stage"
# Parts of 30 MiB: a call carries the working tree (26 MB) too, 64 MiB in
# all, and the tree needs room to grow (a deeper drafter is 3.4 MB a layer);
# the third, smaller part rides with .whl and .jit-cache (training/README.md).
(cd .h200 && split -b 30M flashbar-cuda.tar.xz part- && rm flashbar-cuda.tar.xz)
ls -la .h200
