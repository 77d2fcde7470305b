#!/usr/bin/env bash
# Regenerates the bundle icons from the source icon, src-tauri/icons/icon.svg
# (the Flashbar mark, drawn on the same 64-unit grid as icons/icon.png, the
# window / Linux tray icon): icon.icns for the macOS .app and the PNG sizes
# the .deb installs under /usr/share/icons/hicolor. Uses `tauri icon` from
# @tauri-apps/cli (package.json); the results are committed, so a bundle
# build does not need this. docs/bundle.md says where each goes. (tauri icon
# writes the .icns entries in a varying order: a rerun may show icon.icns
# changed with the same images in it.)
set -euo pipefail
cd "$(dirname "$0")/.."

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
npx --no-install tauri icon src-tauri/icons/icon.svg -o "$out" >/dev/null 2>&1
for file in icon.icns 32x32.png 128x128.png 128x128@2x.png; do
  cp "$out/$file" "src-tauri/icons/$file"
done
echo "icons: src-tauri/icons/{icon.icns,32x32.png,128x128.png,128x128@2x.png} from icon.svg"
