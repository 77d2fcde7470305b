// The tray icon as a desktop panel sees it: libayatana-appindicator (what
// tauri's tray uses on Linux) publishes the icon on the session bus as a
// StatusNotifierItem, at /org/ayatana/NotificationItem/<id>, with the text
// beside the icon in its XAyatanaLabel property. run.sh gives the tests a
// session bus of their own; gdbus reads the label from it.
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);
const ROOT = "/org/ayatana/NotificationItem";

async function call(dest, path, method, ...args) {
  const { stdout } = await run("gdbus", ["call", "--session", "--dest", dest, "--object-path", path, "--method", method, ...args]);
  return stdout;
}

/** The bus name and object path of the app's tray item, or null. */
async function findItem() {
  const names = await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.ListNames");
  for (const [, name] of names.matchAll(/'(:[\d.]+)'/g)) {
    const tree = await run("gdbus", ["introspect", "--session", "--dest", name, "--object-path", ROOT]).catch(() => null);
    const child = /node (\w*flashbar\w*) \{/.exec(tree?.stdout ?? "");
    if (child) return { name, path: `${ROOT}/${child[1]}` };
  }
  return null;
}

let item = null;

/** The tray's label (the text a panel shows beside the icon), or null without a tray item. */
export async function trayLabel() {
  item ??= await findItem();
  if (!item) return null;
  const out = await call(item.name, item.path, "org.freedesktop.DBus.Properties.Get", "org.kde.StatusNotifierItem", "XAyatanaLabel");
  // gdbus prints (<'text'>,) with the text quoted as a GVariant string.
  const match = /^\(<'(.*)'>,\)\s*$/s.exec(out);
  if (!match) throw new Error(`unexpected gdbus output: ${out}`);
  return match[1]
    .replace(/\\u([0-9a-fA-F]{4})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)))
    .replace(/\\(.)/g, "$1");
}

/** Reads the label every `ms` until stopped; `seen` holds each distinct value in order. */
export function watchTrayLabel(ms = 50) {
  const seen = [];
  let running = true;
  const done = (async () => {
    while (running) {
      const label = await trayLabel();
      if (seen.at(-1) !== label) seen.push(label);
      await new Promise((resolve) => setTimeout(resolve, ms));
    }
  })();
  return { seen, stop: async () => ((running = false), await done) };
}
