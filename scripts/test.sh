#!/usr/bin/env bash
# Runs every test: the Rust workspace, the Python reference checks, the UI's
# type check. Run scripts/setup.sh once first (README, command 2).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's banner says the disk left (CI machines are short of it).
stage() { echo "== $1 ($(df -h . | awk 'NR==2 {print $4}') free)"; }

# The app shell embeds ui/dist at compile time, so the UI builds first.
stage "ui"
npm run --silent ui:check
npm run --silent ui:build >/dev/null

stage "ui unit tests (vitest)"
npm run --silent test:ui

# Tiny random checkpoints + mlx-lm reference outputs for the parity tests,
# regenerated only when the generator changes, or what it reads besides:
# the embedded target and bench/acceptance.py's prompts (mlx-lm's greedy
# tokens on them, tests/parity.rs).
stage "fixtures"
fixtures=target/fixtures
stamp="$fixtures/.generator.sha256"
# macOS has shasum (same output and --check) rather than sha256sum.
sha256() { if command -v sha256sum >/dev/null; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }
if ! sha256 --status -c "$stamp" 2>/dev/null; then
  rm -rf "$fixtures" && mkdir -p "$fixtures"
  .venv/bin/python tests/fixtures/make_fixtures.py "$fixtures" >/dev/null
  sha256 tests/fixtures/*.py bench/acceptance.py models/default/target/model.safetensors > "$stamp"
fi

stage "cargo test"
cargo test --workspace

# Each fuzz target (fuzz/): every committed seed replayed, then a fixed
# number of runs from a fixed seed, so the answer is the same on every
# machine (scripts/fuzz.sh --ci). FLASHBAR_FUZZ_SECONDS=N fuzzes N seconds
# a target from a random seed instead; FLASHBAR_SKIP_FUZZ=1 skips the step
# on a local run.
if [ "${FLASHBAR_SKIP_FUZZ:-0}" != 1 ]; then
  stage "fuzz"
  if [ -n "${FLASHBAR_FUZZ_SECONDS:-}" ]; then
    scripts/fuzz.sh "$FLASHBAR_FUZZ_SECONDS"
  else
    scripts/fuzz.sh --ci
  fi
fi
# A one-shot run (.ci/run sets FLASHBAR_ONE_SHOT=1) drops the fuzz build
# (~1.5 GB, its own flags) once it is done: no later step reuses it, and CI
# machines are short of disk.
if [ "${FLASHBAR_ONE_SHOT:-0}" = 1 ]; then
  rm -rf fuzz/target
fi

# The real app under Xvfb: chat, metrics, local server, screenshots in
# target/e2e-screenshots; then its cold start.
stage "app end-to-end (tauri-driver, Xvfb)"
if [ "$(uname -s)" = Darwin ]; then
  echo "skipped on macOS: tauri-driver has no WebDriver for WKWebView, and Xvfb is Linux's (docs/macos.md lists the app checks to do by hand)"
else
  bash tests/e2e/run.sh
fi

# The app as a user installs it: the .deb packed from that same debug build,
# installed with apt and started from /usr/bin under Xvfb (tests/e2e/deb.sh;
# docs/bundle.md). macOS builds its .app with scripts/bundle.sh instead.
stage ".deb: pack, install, start from /usr/bin (Xvfb)"
if [ "$(uname -s)" = Darwin ]; then
  echo "skipped on macOS: the .deb is Linux's; docs/macos.md says how to build and check Flashbar.app there"
else
  bash tests/e2e/deb.sh
fi

stage "python (reference venv)"
.venv/bin/python -m pytest -q tests/python
echo "all tests passed"
