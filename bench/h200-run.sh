#!/usr/bin/env bash
# Device side of bench/h200-pack.sh.
#   bash bench/h200-run.sh collect            (calls carrying a part)
#   bash bench/h200-run.sh collect run ARGS   (the last call; ARGS go to vs_mlx_lm.py)
set -euo pipefail
cd "$(dirname "$0")/.."
home=/tmp/flashbar-bench
step=$1; shift
mkdir -p "$home/parts"
cp .h200/bench-part-* "$home/parts/"
[ "$step" = collect ] && [ "${1:-}" != run ] && { ls "$home/parts"; exit 0; }
[ "${1:-}" = run ] && shift
site=$home/site
rm -rf "$site" "$home/unpacked" && mkdir -p "$site" "$home/unpacked"
cat "$home"/parts/bench-part-* | tar -C "$home/unpacked" -xf -
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$home"/unpacked/*.whl
cp "$home/unpacked/flashbar" "$site/flashbar"
ln -sfn "$(python3 -c 'import nvidia; print(nvidia.__path__[0])')" "$site/nvidia"
export PYTHONPATH=$site
python3 bench/vs_mlx_lm.py --flashbar "$site/flashbar" "$@"
