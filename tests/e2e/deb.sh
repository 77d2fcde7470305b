#!/usr/bin/env bash
# The Linux package as a user installs it: packs the .deb from the debug
# build the end-to-end tests drove (scripts/bundle.sh --debug), installs it
# with apt (as root, or through sudo), starts /usr/bin/flashbar-app through
# tauri-driver under Xvfb and runs installed.test.mjs against it; removes
# the package afterwards. docs/bundle.md has the package's layout.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${DISPLAY:-}" ] && [ -z "${FLASHBAR_E2E_XVFB:-}" ]; then
  exec env FLASHBAR_E2E_XVFB=1 xvfb-run -a -s "-screen 0 1280x900x24" "$0" "$@"
fi
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

deb=$(bash scripts/bundle.sh --debug | tail -n 1)
[ -f "$deb" ] || { echo "deb: scripts/bundle.sh made no package ($deb)" >&2; exit 1; }
echo "deb: $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb --field "$deb" Package Depends

scratch="$(mktemp -d)"
driver_pid=
cleanup() {
  [ -n "$driver_pid" ] && kill "$driver_pid" 2>/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq flashbar >/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
# --reinstall: a package of the same version left by an earlier run is
# replaced by this one. Its dependencies are scripts/setup.sh's packages.
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall --no-install-recommends "$deb" >/dev/null
app=/usr/bin/flashbar-app
dpkg -L flashbar | grep -qx "$app" || { echo "deb: the package has no $app" >&2; dpkg -L flashbar >&2; exit 1; }

export XDG_DATA_HOME="$scratch/data" XDG_CONFIG_HOME="$scratch/config" XDG_CACHE_HOME="$scratch/cache"
mkdir -p "$XDG_DATA_HOME" "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME"
export NO_AT_BRIDGE=1
unset FLASHBAR_DEFAULT_MODEL LD_LIBRARY_PATH
tauri_driver="$(command -v tauri-driver || echo "$HOME/.cargo/bin/tauri-driver")"
"$tauri_driver" --port 4444 > "$scratch/tauri-driver.log" 2>&1 &
driver_pid=$!
for _ in $(seq 50); do
  (exec 3<>/dev/tcp/127.0.0.1/4444) 2>/dev/null && break
  sleep 0.1
done
status=0
FLASHBAR_APP="$app" node --test --test-concurrency=1 tests/e2e/installed.test.mjs || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- tauri-driver log" >&2
  tail -n 40 "$scratch/tauri-driver.log" >&2
fi
exit "$status"
