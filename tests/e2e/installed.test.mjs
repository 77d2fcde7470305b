// The installed .deb (deb.sh): the app started from its installed path
// (/usr/bin) through tauri-driver under Xvfb. It must run on what the
// package put under /usr/lib/Flashbar (docs/bundle.md): the default pair
// from there, MLX's library from there, and answer a chat with them. The
// source tree is still on this machine, so each is checked by its path.
import { By, until } from "selenium-webdriver";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, readlinkSync, realpathSync } from "node:fs";
import { after, before, test } from "node:test";
import { openApp } from "./driver.mjs";

const APP = process.env.FLASHBAR_APP;
const LIB = "/usr/lib/Flashbar";
let driver;

const byTest = (id) => By.css(`[data-testid="${id}"]`);

/** The app's process: the one whose executable is APP. */
function appPid() {
  const exe = realpathSync(APP);
  const pids = readdirSync("/proc").filter((name) => /^\d+$/.test(name));
  const found = pids.filter((pid) => {
    try {
      return readlinkSync(`/proc/${pid}/exe`) === exe;
    } catch {
      return false; // gone, or not ours to read
    }
  });
  assert.equal(found.length, 1, `processes running ${exe}: ${found.join(", ")}`);
  return found[0];
}

before(async () => {
  assert.ok(APP?.startsWith("/usr/bin/"), `FLASHBAR_APP must be the installed binary, not ${APP}`);
  driver = await openApp(APP);
});

after(async () => {
  await driver?.quit();
});

test("the engine loaded the default pair the package installed", async () => {
  const status = await driver.executeAsyncScript(`
    const done = arguments[arguments.length - 1];
    window.__TAURI_INTERNALS__.invoke("engine_status").then(done, (e) => done({ error: String(e) }));
  `);
  assert.equal(status.state, "ready", JSON.stringify(status));
  assert.equal(status.target, `${LIB}/models/default/target`);
  assert.equal(status.drafter, `${LIB}/models/default/drafter`);
});

test("MLX is the package's copy", () => {
  const maps = readFileSync(`/proc/${appPid()}/maps`, "utf8");
  const mlx = [...new Set(maps.split("\n").map((line) => line.split(/\s+/)[5]).filter((p) => p?.includes("libmlx")))];
  assert.deepEqual(mlx, [`${LIB}/mlx/lib/libmlx.so`]);
});

test("chat answers from the installed model", async () => {
  await driver.findElement(byTest("tab-chat")).click();
  await driver.findElement(byTest("chat-input")).sendKeys("def add(a, b):");
  await driver.findElement(byTest("send")).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="turn-assistant"] footer')), 120_000);
  const footer = await driver.findElement(By.css('[data-testid="turn-assistant"] footer')).getText();
  assert.match(footer, /^(stop|length) · [1-9]\d* tokens/, footer);
  const body = await driver.findElement(By.css('[data-testid="turn-assistant"] .body')).getText();
  assert.ok(body.trim().length > 0, "the answer has no text");
});
