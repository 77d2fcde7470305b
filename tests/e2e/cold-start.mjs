// Cold-start benchmark: launches the real app binary N times (fresh XDG
// folders each time, so nothing is warm in the app's data) and measures,
// from spawn, the time until the app reports that the tray and the window
// are ready (the UI's first view on screen; the model keeps loading in the
// background with its own progress). Prints one JSON line; fails when the
// median exceeds the budget (--budget-ms, default 1500).
// Usage: node tests/e2e/cold-start.mjs APP_BINARY [--runs N] [--budget-ms MS]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

const [app, ...rest] = process.argv.slice(2);
const option = (name, fallback) => {
  const i = rest.indexOf(name);
  return i >= 0 ? Number(rest[i + 1]) : fallback;
};
const runs = option("--runs", 5);
const budget = option("--budget-ms", 1500);
if (!app) {
  console.error("usage: node tests/e2e/cold-start.mjs APP_BINARY [--runs N] [--budget-ms MS]");
  process.exit(2);
}

function once() {
  return new Promise((resolve, reject) => {
    const scratch = mkdtempSync(path.join(tmpdir(), "flashbar-cold-"));
    const env = {
      ...process.env,
      XDG_DATA_HOME: path.join(scratch, "data"),
      XDG_CONFIG_HOME: path.join(scratch, "config"),
      XDG_CACHE_HOME: path.join(scratch, "cache"),
      NO_AT_BRIDGE: "1",
    };
    const started = performance.now();
    const child = spawn(app, [], { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const timer = setTimeout(() => finish(new Error("no ready line within 30 s")), 30_000);
    const finish = (result) => {
      clearTimeout(timer);
      child.kill("SIGTERM");
      child.once("exit", () => {
        // WebKit's helper processes may still be writing their shader
        // cache for a moment after the app exits: retry, and never let a
        // leftover scratch folder fail the measurement.
        try {
          rmSync(scratch, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
        } catch (error) {
          console.error(`cold start: could not remove ${scratch}: ${error.message}`);
        }
        result instanceof Error ? reject(result) : resolve(result);
      });
    };
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const match = /ready in (\d+) ms \(tray: (\w+)\)/.exec(out);
      if (match) finish({ wall_ms: Math.round(performance.now() - started), app_ms: Number(match[1]), tray: match[2] });
    });
    child.once("error", (error) => finish(error));
  });
}

const results = [];
for (let i = 0; i < runs; i++) results.push(await once());
const walls = results.map((r) => r.wall_ms).sort((a, b) => a - b);
const median = walls[Math.floor(walls.length / 2)];
console.log(JSON.stringify({ runs, median_ms: median, budget_ms: budget, results }));
if (median > budget) {
  console.error(`cold start: median ${median} ms is over the ${budget} ms budget`);
  process.exit(1);
}
