#!/usr/bin/env bash
# Device side of scripts/h200-pack.sh, run on the GPU machine from the repo
# copy there. Each device call carries one part (.h200/part-*), so:
#   call 1: bash scripts/h200-remote.sh collect
#   call 2: bash scripts/h200-remote.sh collect unpack && /tmp/flashbar-h200/pkg/flashbar smoke
# `collect` copies the parts, wheels and kernel caches this call carried out
# of the repo copy (which the next call replaces) into /tmp/flashbar-h200;
# `unpack` joins all parts, links the CUDA 13 `nvidia` wheels of the local
# Python (torch's) beside `mlx/`, where libmlx looks, and extracts the Python
# wheels collected from .whl/ (mlx's bindings, mlx-lm, z-lab's dflash) into
# the same folder, so that with PYTHONPATH set to it
# Python's mlx uses the very libmlx the binary links (training/h200.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
home=/tmp/flashbar-h200
for step in "$@"; do
  case "$step" in
    collect)
      # whatever this call carried: parts of the pack, the Python wheels
      # (.whl/) and the kernel caches (.jit-cache/, read by training/h200.sh),
      # so a call too full for all three carries them one call earlier
      mkdir -p "$home/parts" "$home/whl" "$home/jit-cache"
      for f in .h200/part-*; do [ -f "$f" ] && cp "$f" "$home/parts/"; done
      for f in .whl/*.whl; do [ -f "$f" ] && cp "$f" "$home/whl/"; done
      for f in .jit-cache/*.tgz; do [ -f "$f" ] && cp "$f" "$home/jit-cache/"; done
      ls "$home/parts" "$home/whl" "$home/jit-cache"
      ;;
    unpack)
      rm -rf "$home/pkg" && mkdir -p "$home/pkg"
      cat "$home"/parts/part-* | xz -d | tar -C "$home/pkg" -xf -
      . scripts/h200-nvidia.sh
      link_nvidia "$home/pkg"
      # A wheel is a zip of the files an install writes; the pack already
      # holds mlx-cuda-13's part of mlx/ (lib, include), the bindings add theirs.
      for wheel in "$home"/whl/*.whl; do [ -f "$wheel" ] && python3 -m zipfile -e "$wheel" "$home/pkg"; done
      echo "unpacked to $home/pkg"
      ;;
    *)
      echo "unknown step: $step (collect | unpack)" >&2
      exit 2
      ;;
  esac
done
