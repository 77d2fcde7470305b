#!/usr/bin/env bash
# Builds the app as a user installs it (docs/bundle.md has the layouts):
#   - macOS: Flashbar.app (`tauri bundle --bundles app`), with the
#     mlx.metallib MLX built copied into Contents/MacOS, where MLX looks
#     first; signed and notarized only when the APPLE_* variables are set
#     (docs/macos.md, "Signing and notarization");
#   - Linux: the .deb (`tauri bundle --bundles deb`), carrying MLX's CPU
#     libraries under /usr/lib/Flashbar.
# A release build is made first; `--debug` packs the debug build that
# `cargo build -p flashbar-app` made instead (what CI tests: no second build).
# The static part of the bundle is src-tauri/tauri.conf.json > bundle; what
# depends on this machine (where MLX's files are) is merged in from a
# generated config, target/bundle-paths.json. Prints the bundle's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
[ "${1:-}" = --debug ] && profile=debug
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
profile_dir="$target_dir/$profile"
paths="$target_dir/bundle-paths.json"
mkdir -p "$target_dir"
# `tauri bundle [--debug] ...` (macOS's bash 3.2 has no empty arrays under set -u).
bundle() {
  if [ "$profile" = debug ]; then set -- --debug "$@"; fi
  npx --no-install tauri bundle "$@"
}

# The app embeds ui/dist when it compiles. --debug packs the UI the debug
# build embedded (rebuilding ui/dist would make cargo rebuild the app).
if [ "$profile" = release ]; then
  npm run --silent ui:build >/dev/null
  cargo build --release -p flashbar-app
else
  [ -f ui/dist/index.html ] || npm run --silent ui:build >/dev/null
  cargo build --quiet -p flashbar-app
fi

if [ "$(uname -s)" = Darwin ]; then
  # Where crates/mlx-sys/build/macos.rs has MLX write the metallib.
  key=$(sed -n 's/^const METALLIB_KEY: &str = "\(.*\)";$/\1/p' crates/mlx-sys/build/macos.rs)
  metallib="${MLX_RS_METAL_PATH:-$HOME/.mlx/lib/$key}/mlx.metallib"
  [ -f "$metallib" ] || { echo "bundle: no $metallib (see docs/macos.md, item 2)" >&2; exit 1; }
  printf '{"bundle":{"macOS":{"files":{"MacOS/mlx.metallib":"%s"}}}}\n' "$metallib" > "$paths"
  bundle --bundles app --config "$paths"
  app="$profile_dir/bundle/macos/Flashbar.app"
  # The layout docs/bundle.md promises.
  for file in Contents/MacOS/mlx.metallib Contents/Resources/models/default/target/config.json \
    Contents/Resources/models/default/drafter/config.json Contents/Resources/icon.icns; do
    [ -f "$app/$file" ] || { echo "bundle: $app has no $file" >&2; exit 1; }
  done
  plist="$app/Contents/Info.plist"
  [ "$(plutil -extract LSUIElement raw "$plist")" = true ] || { echo "bundle: LSUIElement is not set" >&2; exit 1; }
  [ "$(plutil -extract LSMinimumSystemVersion raw "$plist")" = 14.0 ] || { echo "bundle: minimum macOS is not 14.0" >&2; exit 1; }
  echo "$app"
  exit 0
fi

# The CPU build's libraries as the binary uses them (links resolved: the
# OpenBLAS that crates/mlx-sys/build/blas.rs put in place of the wheel's
# reference BLAS is packed under the wheel's file name), and mlx/include,
# which MLX's CPU compiler uses when it is there (as in a build run in place).
[ -d "$profile_dir/mlx_cpu.libs" ] || { echo "bundle: no $profile_dir/mlx_cpu.libs (the .deb packs the CPU build)" >&2; exit 1; }
lib=/usr/lib/Flashbar
{
  printf '{"bundle":{"linux":{"deb":{"files":{\n'
  printf '  "%s/mlx/lib/libmlx.so": "%s",\n' "$lib" "$(readlink -f "$profile_dir/mlx/lib/libmlx.so")"
  printf '  "%s/mlx/include": "%s"' "$lib" "$(readlink -f "$profile_dir/mlx/include")"
  for file in "$profile_dir"/mlx_cpu.libs/*; do
    printf ',\n  "%s/mlx_cpu.libs/%s": "%s"' "$lib" "$(basename "$file")" "$(readlink -f "$file")"
  done
  printf '\n}}}}}\n'
} > "$paths"
# --no-binary-patching: the packed binary stays byte for byte the one cargo
# built (the patch only serves Tauri's updater, which Flashbar does not use).
bundle --bundles deb --no-binary-patching --config "$paths"
ls "$profile_dir"/bundle/deb/*.deb | tail -1
