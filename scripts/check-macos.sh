#!/usr/bin/env bash
# Checks the whole workspace, app included, for macOS on Apple Silicon from a
# machine without a macOS SDK (Linux CI): `cargo check` and `cargo clippy
# -D warnings` for aarch64-apple-darwin. Nothing is linked, so:
#   - crates/mlx-sys sees a target other than the host and only generates its
#     bindings; bindgen reads mlx-c's headers with libclang's own headers and
#     three tiny libc stand-ins (scripts/macos-check/include);
#   - the build scripts of C dependencies (onig_sys, objc2-exception-helper)
#     compile with a stand-in compiler (scripts/macos-check/cc) whose empty
#     objects are never linked.
# On a Mac none of this is needed: there `cargo check` builds for the host.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-apple-darwin
stubs=$PWD/scripts/macos-check
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

# libclang's headers (stdint.h, float.h, arm_fp16.h, ...), which libclang
# does not find by itself for an Apple target.
resource=$(ls -d /usr/lib/llvm-*/lib/clang/*/include 2>/dev/null | sort -V | tail -1)
if [ -z "$resource" ]; then
  echo "check-macos: no libclang headers under /usr/lib/llvm-*/lib/clang (libclang-dev)" >&2
  exit 1
fi
# -nostdinc: the host's glibc headers are not macOS's. +bf16: newer clangs
# (Apple's included) accept __bf16 on every arm64 target, clang 14 only so.
export BINDGEN_EXTRA_CLANG_ARGS_aarch64_apple_darwin="-nostdinc -isystem $resource -isystem $stubs/include -Xclang -target-feature -Xclang +bf16"
export CC_aarch64_apple_darwin=$stubs/cc
export AR_aarch64_apple_darwin=ar

cargo check --workspace --target "$target"
cargo clippy --workspace --all-targets --target "$target" -- -D warnings
