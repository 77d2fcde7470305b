#!/usr/bin/env bash
# Installs everything Flashbar needs to build, run and test on Debian 12
# (as root, or through sudo), and does nothing for what is already there
# (on macOS it checks the Apple tools instead of the apt packages: below):
#   - Debian packages: compilers, libclang (bindgen), the WebKitGTK / GTK /
#     appindicator libraries of the Tauri app, and the test tools;
#   - the pinned MLX wheels (checked by crates/mlx-sys/build when used);
#   - .venv: the Python references the parity tests compare against;
#   - node_modules: the UI's packages, from package-lock.json.
# Rust itself must already be installed (https://rustup.rs); we check for it.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

macos=0
[ "$(uname -s)" = Darwin ] && macos=1

# macOS (Apple Silicon): crates/mlx-sys builds MLX from source with Metal, so
# it needs the Xcode command-line tools, Xcode's Metal toolchain and CMake
# (Homebrew installs CMake and Node when it is there); WebKit is the system's.
if [ "$macos" = 1 ]; then
  if ! xcode-select -p >/dev/null 2>&1; then
    say "the Xcode command-line tools are missing: running xcode-select --install; run this again when it is done" >&2
    xcode-select --install || true
    exit 1
  fi
  if ! xcrun -sdk macosx metal -v >/dev/null 2>&1; then
    say "no Metal compiler (xcrun metal): install Xcode, then: xcodebuild -downloadComponent MetalToolchain" >&2
    exit 1
  fi
  for tool in cmake node; do
    command -v "$tool" >/dev/null && continue
    if command -v brew >/dev/null; then
      say "brew: installing $tool"
      brew install "$tool"
    else
      say "$tool is missing: install it (e.g. with Homebrew: brew install $tool), then run this again" >&2
      exit 1
    fi
  done
fi

[ "$macos" = 1 ] || {
apt_packages=(
  build-essential g++ pkg-config libclang-dev xz-utils libopenblas0-pthread
  python3 python3-venv python3-pip
  libwebkit2gtk-4.1-dev libgtk-3-dev libayatana-appindicator3-dev librsvg2-dev
  libssl-dev libxdo-dev
  xvfb xauth imagemagick webkit2gtk-driver
  dbus-daemon libglib2.0-bin  # e2e: a session bus, and gdbus to read the tray's label
)
command -v node >/dev/null && command -v npm >/dev/null || apt_packages+=(nodejs npm)

missing=()
for package in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
}

if ! command -v cargo >/dev/null; then
  say "Rust is missing: install it with rustup (https://rustup.rs), then run this again." >&2
  exit 1
fi

# The MLX wheels: downloaded once into the cache the mlx-sys build reads.
wheel_cache="${XDG_CACHE_HOME:-$HOME/.cache}/flashbar/wheels"
fetch_wheel() {
  local requirement=$1 file=$2
  [ -f "$wheel_cache/$file" ] && return 0
  say "wheel: $requirement"
  mkdir -p "$wheel_cache"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_35_x86_64 --dest "$wheel_cache" "$requirement"
}
# Linux only: on macOS MLX is built from source.
if [ "$macos" = 0 ]; then
fetch_wheel mlx-cpu==0.32.2 mlx_cpu-0.32.2-py3-none-manylinux_2_35_x86_64.whl
if [ "${FLASHBAR_CUDA:-0}" = 1 ]; then
  fetch_wheel mlx-cuda-13==0.32.2 mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl
fi
fi

# The Python reference venv, rebuilt only when the pinned lock changes.
lock=tests/python/requirements.txt
stamp=.venv/.flashbar-lock
if [ ! -f "$stamp" ] || ! cmp -s "$lock" "$stamp"; then
  say "venv: installing the Python references"
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  if [ "$macos" = 1 ]; then
    # mlx-cpu is Linux's CPU build of MLX; macOS's mlx wheel has Metal itself.
    grep -v '^mlx-cpu==' "$lock" > .venv/requirements-macos.txt
    .venv/bin/python -m pip install --quiet -r .venv/requirements-macos.txt
  else
  .venv/bin/python -m pip install --quiet -r "$lock"
  fi
  .venv/bin/python -m pip install --quiet --no-deps dflash==0.1.0
  cp "$lock" "$stamp"
fi

# The fuzz smoke (scripts/fuzz.sh): a nightly toolchain and cargo-fuzz.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  say "rustup: installing the nightly toolchain (for cargo-fuzz)"
  rustup toolchain install nightly --profile minimal
fi
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz 0.13.2" ]; then
  say "cargo: installing cargo-fuzz 0.13.2"
  cargo install cargo-fuzz --version =0.13.2 --locked
fi

# npm packages, reinstalled only when package-lock.json changes.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "npm: installing packages"
  npm ci --no-audit --no-fund --loglevel=error
fi
# The app's end-to-end tests (tests/e2e) drive the real window through
# tauri-driver, which talks to WebKitWebDriver (webkit2gtk-driver, above).
# (Linux only: tauri-driver has no WebDriver for macOS's WKWebView.)
if [ "$macos" = 0 ] && ! cargo install --list | grep -q '^tauri-driver v2.1.0:'; then
  say "cargo: installing tauri-driver 2.1.0"
  cargo install tauri-driver --version =2.1.0 --locked
fi

say "ready"
