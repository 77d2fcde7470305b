#!/usr/bin/env bash
# Runs every test: the Rust workspace, the Python reference checks, the UI's
# type check. Run scripts/setup.sh once first (README, command 2).
set -euo pipefail
cd "$(dirname "$0")/.."

# The app shell embeds ui/dist at compile time, so the UI builds first.
echo "== ui"
npm run --silent ui:check
npm run --silent ui:build >/dev/null

echo "== cargo test"
cargo test --workspace --all-targets
cargo test --workspace --doc

echo "== python (reference venv)"
.venv/bin/python -m pytest -q tests/python
echo "all tests passed"
