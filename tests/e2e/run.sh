#!/usr/bin/env bash
# End-to-end tests of the real app under Xvfb: builds the app (debug),
# starts tauri-driver (WebKitWebDriver behind it) with the XDG folders in a
# temp dir, and runs app.test.mjs with node's test runner. Screenshots of
# each view land in target/e2e-screenshots. Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${DISPLAY:-}" ] && [ -z "${FLASHBAR_E2E_XVFB:-}" ]; then
  exec env FLASHBAR_E2E_XVFB=1 xvfb-run -a -s "-screen 0 1280x900x24" "$0" "$@"
fi

cargo build --quiet -p flashbar-app
app="$PWD/target/debug/flashbar-app"
tauri_driver="$(command -v tauri-driver || echo "$HOME/.cargo/bin/tauri-driver")"

scratch="$(mktemp -d)"
export XDG_DATA_HOME="$scratch/data" XDG_CONFIG_HOME="$scratch/config" XDG_CACHE_HOME="$scratch/cache"
mkdir -p "$XDG_DATA_HOME" "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME"
# No accessibility bus under Xvfb: keep GTK from waiting for one.
export NO_AT_BRIDGE=1

"$tauri_driver" --port 4444 > "$scratch/tauri-driver.log" 2>&1 &
driver_pid=$!
cleanup() { kill "$driver_pid" 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT
for _ in $(seq 50); do
  (exec 3<>/dev/tcp/127.0.0.1/4444) 2>/dev/null && break
  sleep 0.1
done

export FLASHBAR_APP="$app" E2E_SCREENSHOTS="$PWD/target/e2e-screenshots"
status=0
node --test --test-concurrency=1 tests/e2e/app.test.mjs || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- tauri-driver log" >&2
  tail -n 40 "$scratch/tauri-driver.log" >&2
  exit "$status"
fi

# Cold start until tray + window are ready (goal: 1.5 s). On a shared CI
# machine with a debug build the bound is loose; it catches regressions.
echo "== cold start"
node tests/e2e/cold-start.mjs "$app" --runs 3 --budget-ms "${FLASHBAR_COLD_START_BUDGET_MS:-5000}"
