#!/usr/bin/env bash
# Device side of scripts/h200-pack.sh, run on the GPU machine from the repo
# copy there. Each device call carries one part (.h200/part-*), so:
#   call 1: bash scripts/h200-remote.sh collect
#   call 2: bash scripts/h200-remote.sh collect unpack && /tmp/flashbar-h200/pkg/flashbar smoke
# `collect` copies the parts this call carried out of the repo copy (which the
# next call replaces); `unpack` joins all parts and links the CUDA 13 `nvidia`
# wheels of the local Python (torch's) beside `mlx/`, where libmlx looks.
set -euo pipefail
cd "$(dirname "$0")/.."
home=/tmp/flashbar-h200
for step in "$@"; do
  case "$step" in
    collect)
      mkdir -p "$home/parts"
      cp .h200/part-* "$home/parts/"
      ls "$home/parts"
      ;;
    unpack)
      rm -rf "$home/pkg" && mkdir -p "$home/pkg"
      cat "$home"/parts/part-* | xz -d | tar -C "$home/pkg" -xf -
      nvidia=$(python3 -c 'import nvidia; print(nvidia.__path__[0])')
      ln -sfn "$nvidia" "$home/pkg/nvidia"
      echo "unpacked to $home/pkg (nvidia -> $nvidia)"
      ;;
    *)
      echo "unknown step: $step (collect | unpack)" >&2
      exit 2
      ;;
  esac
done
