#!/usr/bin/env bash
# Builds `flashbar` against MLX's CUDA wheel (cargo feature `cuda`) and packs
# it with the wheel's libraries for an NVIDIA machine that has no Rust and no
# registry: .h200/flashbar-cuda.tar.xz, split into 36 MB parts (one device
# call carries at most 64 MiB). scripts/h200-remote.sh is the device side.
#
# The binary's rpath is $ORIGIN/mlx/lib and libmlx's own RPATH names
# ../../nvidia, so the pack works from any folder once `nvidia` (the CUDA 13
# nvidia-* wheels, e.g. torch's) is linked beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=target/cuda
# The nvidia libraries libmlx needs exist only on the GPU machine.
export RUSTFLAGS="-C link-arg=-Wl,-rpath,\$ORIGIN/mlx/lib:\$ORIGIN/../mlx/lib -C link-arg=-Wl,--allow-shlib-undefined"
CARGO_TARGET_DIR=$target cargo build --release --features cuda -p flashbar-cli
profile=$target/release

stage=.h200/stage
rm -rf .h200 && mkdir -p "$stage"
cp "$profile/flashbar" "$stage/"
cp -rL "$profile/mlx" "$stage/mlx"
# mlx/include stays: the CUDA backend JIT-compiles kernels against those headers.
rm -rf "$stage/mlx/share"
cp -rL "$profile/mlx_cuda_13.libs" "$stage/"
strip "$stage/flashbar" "$stage/mlx/lib/libmlx.so"
tar -C "$stage" -cf - . | xz -T2 -6 > .h200/flashbar-cuda.tar.xz
rm -rf "$stage"
# Parts of 36 MB: a call carries the ~24 MB working tree too, 64 MiB in all.
(cd .h200 && split -b 36M flashbar-cuda.tar.xz part- && rm flashbar-cuda.tar.xz)
ls -la .h200
