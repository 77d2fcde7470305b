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
. scripts/h200-nvidia.sh
link_nvidia "$site"
export PYTHONPATH=$site FLASHBAR=$site/flashbar FIXTURES=$home/unpacked/fixtures
if [ "$mode" = exec ]; then
  "$@"
else
  python3 bench/vs_mlx_lm.py --flashbar "$site/flashbar" "$@"
fi
