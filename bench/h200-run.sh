#!/usr/bin/env bash
# Device side of bench/h200-pack.sh.
#   bash bench/h200-run.sh collect            (calls carrying a part)
#   bash bench/h200-run.sh collect run ARGS   (the last call; ARGS go to vs_mlx_lm.py)
#   bash bench/h200-run.sh collect exec CMD   (the last call; runs CMD with FLASHBAR,
#                                              FIXTURES and PYTHONPATH set)
set -euo pipefail
cd "$(dirname "$0")/.."
home=/tmp/flashbar-bench
step=$1; shift
mkdir -p "$home/parts"
cp .h200/bench-part-* "$home/parts/"
mode=${1:-}
[ "$step" = collect ] && [ "$mode" != run ] && [ "$mode" != exec ] && { ls "$home/parts"; exit 0; }
shift
site=$home/site
rm -rf "$site" "$home/unpacked" && mkdir -p "$site" "$home/unpacked"
cat "$home"/parts/bench-part-* | tar -C "$home/unpacked" -xf -
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$home"/unpacked/*.whl
cp "$home/unpacked/flashbar" "$site/flashbar"
link_nvidia() {
  # libmlx finds the CUDA wheels at ../../nvidia beside mlx/. Torch's nvidia
  # folder has them, but its cu13/include lacks crt/ (which MLX's run-time
  # compiled quantized matmuls include): overlay it from the CUDA toolkit.
  local torch_nvidia; torch_nvidia=$(python3 -c 'import nvidia; print(nvidia.__path__[0])')
  local crt=/usr/local/cuda/targets/x86_64-linux/include/crt
  [ -d "$crt" ] || crt=$(ls -d /usr/local/cuda-*/targets/x86_64-linux/include/crt 2>/dev/null | head -1)
  if [ -z "$crt" ] || [ -d "$torch_nvidia/cu13/include/crt" ]; then
    ln -sfn "$torch_nvidia" "$site/nvidia"; return
  fi
  mkdir -p "$site/nvidia/cu13/include"
  for entry in "$torch_nvidia"/*; do [ "$(basename "$entry")" = cu13 ] || ln -sfn "$entry" "$site/nvidia/"; done
  for entry in "$torch_nvidia"/cu13/*; do [ "$(basename "$entry")" = include ] || ln -sfn "$entry" "$site/nvidia/cu13/"; done
  for entry in "$torch_nvidia"/cu13/include/*; do ln -sfn "$entry" "$site/nvidia/cu13/include/"; done
  ln -sfn "$crt" "$site/nvidia/cu13/include/crt"
}
link_nvidia
export PYTHONPATH=$site FLASHBAR=$site/flashbar FIXTURES=$home/unpacked/fixtures
if [ "$mode" = exec ]; then
  "$@"
else
  python3 bench/vs_mlx_lm.py --flashbar "$site/flashbar" "$@"
fi
