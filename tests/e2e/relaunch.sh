#!/usr/bin/env bash
# A launch that meets the previous instance on its way out starts anyway
# (src-tauri/src/shell/relaunch.rs). Instance A takes the single-instance
# name on the session bus and is stopped (it holds the name but cannot
# answer, as an app unloading its model); B launches, finds the name taken
# and asks A to show itself; A dies without answering. B must start over
# and run, owning the name. Run by run.sh (a session bus, a display).
set -euo pipefail
app=$1
log=$(mktemp -d)
a= b=
cleanup() {
  for pid in $a $b; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$log"
}
trap cleanup EXIT
owner() {
  gdbus call --session --dest org.freedesktop.DBus --object-path /org/freedesktop/DBus \
    --method org.freedesktop.DBus.ListNames | grep -o "[A-Za-z0-9_.-]*SingleInstance[A-Za-z0-9_.-]*" || true
}

"$app" > "$log/a.log" 2>&1 & a=$!
for _ in $(seq 300); do [ -n "$(owner)" ] && break; sleep 0.1; done
[ -n "$(owner)" ] || { echo "relaunch: the first instance never took its name" >&2; cat "$log/a.log" >&2; exit 1; }
kill -STOP "$a"
"$app" > "$log/b.log" 2>&1 & b=$!
sleep 2
kill -9 "$a"
wait "$a" 2>/dev/null || true
a=
# B starts over after 300 ms pauses and loads the embedded pair.
for _ in $(seq 150); do
  grep -q "ready in" "$log/b.log" && break
  kill -0 "$b" 2>/dev/null || break
  sleep 0.1
done
if ! kill -0 "$b" 2>/dev/null || [ -z "$(owner)" ]; then
  echo "relaunch: the second launch did not start after the first one died:" >&2
  cat "$log/b.log" >&2
  exit 1
fi
echo "relaunch: the second launch started after the first one died unanswering"
