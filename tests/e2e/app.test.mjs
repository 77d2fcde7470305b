// End-to-end: the real app binary (debug build) driven through tauri-driver
// + WebKitWebDriver under Xvfb (see run.sh). Chat streams text from the
// real engine on the embedded pair; the metrics chart gets points; the
// local server switch starts an endpoint that answers over HTTP, whose
// rounds reach the chart too; the Models view downloads a pair from the
// local test hub (run.sh), with a moving progress bar, cancel and resume,
// and loads it; the log folder Settings names holds a log file that the
// server's request line grows, and the Server panel shows that line; after
// the idle unload (2 s here) the next message reloads the pair and answers,
// saying so in its footer. While an answer streams the tray shows its
// speed beside the icon, and nothing once it is done. Every
// view is saved as a screenshot in $E2E_SCREENSHOTS,
// in light mode (dark.test.mjs takes the dark ones).
import { By, until } from "selenium-webdriver";
import assert from "node:assert/strict";
import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { after, before, test } from "node:test";
import { ENGINE_READY, openApp } from "./driver.mjs";
import { trayLabel, watchTrayLabel } from "./tray.mjs";

// Generous: CI machines share their two cores, and a wait only costs time when it fails.
const WAIT = 30_000;
const APP = process.env.FLASHBAR_APP;
const SHOTS = path.join(process.env.E2E_SCREENSHOTS ?? "target/e2e-screenshots", "light");
const PAIR = "e2e-tiny";
let driver;
/** Points on the chart after the chat's answer. */
let chatPoints = 0;

async function shot(name) {
  await mkdir(SHOTS, { recursive: true });
  await writeFile(path.join(SHOTS, `${name}.png`), await driver.takeScreenshot(), "base64");
}

const byTest = (id) => By.css(`[data-testid="${id}"]`);

async function tab(view) {
  await driver.findElement(byTest(`tab-${view}`)).click();
  await driver.wait(until.elementLocated(By.css(`main[data-view="${view}"]`)), 5000);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

before(async () => {
  assert.ok(APP, "FLASHBAR_APP must name the app binary");
  driver = await openApp(APP);
  const dark = await driver.executeScript("return matchMedia('(prefers-color-scheme: dark)').matches");
  assert.equal(dark, false, "this pass is the light one");
});

after(async () => {
  await driver?.quit();
});

test("chat streams an answer from the engine", async () => {
  await tab("chat");
  await shot("chat-empty");
  const input = await driver.findElement(byTest("chat-input"));
  await input.sendKeys("def fib(n):");
  // The tray as the desktop's panel sees it (tray.mjs): plain while idle.
  assert.equal(await trayLabel(), "", "the tray has no tray item, or a label while idle");
  const tray = watchTrayLabel();
  await driver.findElement(byTest("send")).click();
  const answer = await driver.wait(until.elementLocated(By.css('[data-testid="turn-assistant"]')), WAIT);
  // Streaming: text shows up before the answer is finished.
  const body = await answer.findElement(By.css(".body"));
  await driver.wait(async () => (await body.getText()).trim().length > 0, 60_000, "no streamed text");
  await driver.wait(until.elementLocated(By.css('[data-testid="turn-assistant"] footer')), 120_000);
  const footer = await driver.findElement(By.css('[data-testid="turn-assistant"] footer')).getText();
  assert.match(footer, /^(stop|length) · \d+ tokens/, footer);
  await driver.wait(async () => (await trayLabel()) === "", 5000, "the tray kept its label after the answer");
  await tray.stop();
  // Its live speed while the answer streamed ("84 tok/s · DFlash 2.3x", or
  // "80 tok/s" on plain rounds), then back to the plain icon.
  const speeds = tray.seen.filter((label) => label !== "");
  assert.ok(speeds.length > 0, `the tray showed no speed: ${JSON.stringify(tray.seen)}`);
  for (const label of speeds) assert.match(label, /^\d+ tok\/s(?: · DFlash(?: \d+\.\dx)?)?$/, label);
  assert.equal(tray.seen.at(-1), "");
  await shot("chat-answered");
  // Saved through the app shell to the history file (atomic write), not to
  // the webview's localStorage.
  const file = path.join(process.env.XDG_DATA_HOME ?? "", "app.flashbar.desktop", "conversations.json");
  let saved = [];
  const finished = async () => {
    saved = JSON.parse(await readFile(file, "utf8").catch(() => "[]"));
    return saved[0]?.turns?.[1]?.finish === footer;
  };
  await driver.wait(finished, WAIT, `the answer is not in ${file}`);
  assert.equal(saved[0].turns[0].segments[0].text, "def fib(n):");
  assert.equal(await driver.executeScript("return localStorage.getItem('flashbar.conversations')"), null);
  assert.equal(await driver.findElement(byTest("history-problem")).isDisplayed(), false);
});

test("the metrics chart has a point per round", async () => {
  await tab("metrics");
  const canvas = await driver.findElement(byTest("accept-chart"));
  // Drawn at a real size once the tab is shown.
  await driver.wait(async () => (await canvas.getRect()).width > 100, 5000, "the chart has no size");
  const points = Number(await canvas.getAttribute("data-points"));
  assert.ok(points > 0, `accept-chart has ${points} points`);
  const summary = await driver.findElement(byTest("metrics-summary")).getText();
  assert.match(summary, new RegExp(`^${points} rounds \\(\\d+ plain\\)`), summary);
  // The headline: time saved or lost against plain decoding, in one number.
  const saved = await driver.findElement(byTest("metrics-saved")).getText();
  assert.match(saved, /^(?:(?:saved|lost) \d+(?:\.\d+)? m?s vs plain decoding \(\d+\.\d\d× overall\)|time saved: not measured yet)$/, saved);
  chatPoints = points;
  await shot("metrics");
});

test("the local server switch serves the app's model over HTTP", async () => {
  await tab("settings");
  const port = await freePort();
  const portField = await driver.findElement(byTest("port"));
  await portField.clear();
  await portField.sendKeys(String(port), "\t");
  await driver.wait(async () => (await driver.findElement(byTest("settings-message")).getText()) === "Saved.", WAIT);
  await driver.findElement(byTest("server-toggle")).click();
  const status = await driver.wait(
    until.elementLocated(By.css('[data-testid="server-status"][data-running="true"]')),
    15_000,
  );
  const address = await status.getAttribute("data-address");
  assert.equal(address, `http://127.0.0.1:${port}`);
  // The log folder Settings names holds the app's log (docs/logging.md).
  const logDir = await driver.findElement(byTest("log-path")).getText();
  const readLogs = async () => {
    let text = "";
    for (const name of await readdir(logDir)) {
      if (/^flashbar\..*log$/.test(name)) text += await readFile(path.join(logDir, name), "utf8");
    }
    return text;
  };
  const logged = (await readLogs()).length;
  assert.ok(logged > 0, `no log file in ${logDir}`);
  const prompt = "tell me about zebras";
  const response = await fetch(`${address}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: prompt }], max_tokens: 8 }),
  });
  assert.equal(response.status, 200);
  const body = await response.json();
  assert.equal(body.object, "chat.completion");
  assert.ok(body.usage.completion_tokens > 0, JSON.stringify(body.usage));
  await shot("settings-server-on");
  // One line for the request in the Server panel and in the log file, no prompt text in either.
  await tab("server");
  const line = await driver.wait(async () => {
    for (const item of await driver.findElements(By.css('[data-testid="server-lines"] li'))) {
      const text = await item.getText();
      if (text.startsWith("POST /v1/chat/completions 200")) return text;
    }
    return false;
  }, WAIT, "the request is not in the Server panel");
  assert.match(line, new RegExp(`completion_tokens=${body.usage.completion_tokens} `));
  await shot("server");
  await driver.wait(async () => (await readLogs()).includes("POST /v1/chat/completions 200"), WAIT, "the request line is not in the log file");
  const log = await readLogs();
  assert.ok(log.length > logged, "the log file did not grow");
  assert.ok(!log.includes("zebras") && !line.includes("zebras"), "prompt text was logged");
  // The request's rounds reach the metrics chart like the chat's.
  await tab("metrics");
  const canvas = await driver.findElement(byTest("accept-chart"));
  await driver.wait(
    async () => Number(await canvas.getAttribute("data-points")) > chatPoints,
    WAIT,
    `the HTTP request added no rounds to the ${chatPoints} of the chat`,
  );
  await tab("settings");
  // And off again: the port is released.
  await driver.findElement(byTest("server-toggle")).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="server-status"][data-running="false"]')), 15_000);
  await assert.rejects(fetch(`${address}/health`));
});

/** The app process's anonymous resident memory (Linux /proc). */
async function appAnonBytes() {
  const pids = [];
  for (const pid of (await readdir("/proc")).filter((name) => /^\d+$/.test(name))) {
    const comm = await readFile(`/proc/${pid}/comm`, "utf8").catch(() => "");
    if (comm.trim() === "flashbar-app") pids.push(pid);
  }
  assert.equal(pids.length, 1, `one app process, got ${pids}`);
  const status = await readFile(`/proc/${pids[0]}/status`, "utf8");
  return Number(/^RssAnon:\s+(\d+) kB/m.exec(status)[1]) * 1024;
}

test("after the idle unload the next message reloads the pair and answers", async () => {
  // run.sh sets FLASHBAR_IDLE_UNLOAD_SECONDS=2: idle longer than that, the
  // worker has dropped the pair. In a conversation of its own, deleted
  // after, so the first one stays as the dark pass expects it.
  await tab("chat");
  await driver.findElement(byTest("new-chat")).click();
  await driver.wait(async () => (await driver.findElements(byTest("turn-assistant"))).length === 0, 5000);
  await driver.sleep(3500);
  await driver.findElement(byTest("chat-input")).sendKeys("import os");
  await driver.findElement(byTest("send")).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="turn-assistant"] footer')), 120_000, "no answer after the unload");
  const footer = await driver.findElement(By.css('[data-testid="turn-assistant"] footer')).getText();
  assert.match(footer, /^(stop|length) · \d+ tokens .* · model reloaded in \d+\.\d s \(it was unloaded while idle\)$/, footer);
  await shot("chat-reloaded");
  // The app's own memory (anonymous resident pages, /proc) with the pair
  // just used, and once the idle unload has run again: most of the pair's
  // ~110 MB comes back (the engine's idle_unload_memory test counts it).
  const loaded = await appAnonBytes();
  await driver.sleep(3500);
  const unloaded = await appAnonBytes();
  console.log(`app anonymous memory: ${loaded} bytes loaded, ${unloaded} after the idle unload`);
  assert.ok(loaded - unloaded > 64 << 20, `the unload gave back ${loaded - unloaded} of ${loaded} bytes`);
  await driver.findElement(byTest("delete-chat")).click();
  await driver.wait(async () => /def fib/.test(await driver.findElement(byTest("turn-user")).getText()), 5000,
    "the first conversation is back");
});

test("the models view shows the pair in use and the doctor's verdict", async () => {
  await tab("models");
  const pair = await driver.findElement(byTest("current-pair")).getText();
  assert.match(pair, /models\/default\/target/);
  assert.match(pair, /ready/);
  await driver.findElement(byTest("check-pair")).click();
  const verdict = await driver.wait(until.elementLocated(By.css('[data-testid="verdict"][data-ok="true"]')), 30_000);
  assert.match(await verdict.getText(), /drafter: \d+ layers, block \d+/);
  // A drafter alone is not a target: the doctor says why.
  const [, drafterField] = await driver.findElements(By.css('[data-testid="current-pair"] dd'));
  const drafter = await drafterField.getText();
  assert.match(drafter, /models\/default\/drafter$/);
  await driver.findElement(byTest("target-path")).sendKeys(drafter);
  await driver.findElement(byTest("check-pair")).click();
  const refused = await driver
    .wait(until.elementLocated(By.css('[data-testid="verdict"][data-ok="false"]')), 30_000)
    .catch(async (error) => {
      await shot("models-failed");
      throw error;
    });
  assert.match(await refused.getText(), /Doctor: this pair cannot be used\.\s*✗ /);
  assert.equal(await driver.findElement(byTest("use-pair")).isEnabled(), false);
  await shot("models");
});

// The pair's row is redrawn on every progress event: read it in one script
// call, and retry a click that lands on a row just replaced.
const ROW = `[data-testid="pair-${PAIR}"]`;

/** The pair's progress bar value (percent), or -1 while it has none. */
async function barValue() {
  return driver.executeScript(`const b = document.querySelector('${ROW} progress'); return b ? b.value : -1;`);
}

async function rowState() {
  return driver.executeScript(`return document.querySelector('${ROW}')?.dataset.state ?? null;`);
}

async function rowText(testid) {
  return driver.executeScript(`return document.querySelector('${ROW} [data-testid="${testid}"]')?.textContent ?? "";`);
}

async function clickFresh(testid) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await driver.findElement(byTest(testid)).click();
    } catch (error) {
      if (error.name !== "StaleElementReferenceError" || attempt >= 5) throw error;
    }
  }
}

test("the models view downloads a pair from the local hub, cancels, resumes and loads it", async () => {
  await tab("models");
  await driver.wait(until.elementLocated(byTest(`pair-${PAIR}`)), WAIT);
  assert.equal(await rowState(), "remote");
  await driver.findElement(byTest(`download-${PAIR}`)).click();
  let first = 0;
  await driver.wait(async () => (first = await barValue()) > 0, 20_000, "the bar never moved off 0");
  await driver.wait(async () => (await barValue()) > first + 5, 20_000, `the bar stayed at ${first}%`);
  await shot("models-downloading");
  const progress = await rowText("download-text");
  assert.match(progress, /MB of \d+ MB · [\d.]+ [kM]B\/s · .+ left/, progress);
  await clickFresh(`cancel-${PAIR}`);
  await driver.wait(async () => (await rowState()) === "cancelled", WAIT, "not cancelled");
  const paused = await barValue();
  assert.ok(paused > 0 && paused < 100, `paused at ${paused}%`);
  // Resume: the bar starts from the partial files, not from 0.
  await clickFresh(`resume-${PAIR}`);
  await driver.wait(async () => (await rowState()) !== "cancelled", WAIT, "the resume did not start");
  let resumed = -1;
  await driver.wait(async () => (resumed = await barValue()) > 0 || (await rowState()) === "local", WAIT, "the resumed download shows no progress");
  assert.ok(resumed === -1 || resumed >= paused - 5, `resumed at ${resumed}% after pausing at ${paused}%`);
  await driver.wait(async () => (await rowState()) === "local", 60_000, "the download did not finish");
  await driver.wait(until.elementLocated(byTest("local-flashbar-e2e/tiny-target")), 5000);
  assert.match(await driver.findElement(byTest("disk-use")).getText(), /MB in .+/);
  // Choose it: the doctor's verdict, then the engine loads it.
  await driver.findElement(byTest(`choose-${PAIR}`)).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="verdict"][data-ok="true"]')), 30_000);
  await driver.findElement(byTest("use-pair")).click();
  await driver.wait(
    async () => (await driver.findElement(byTest("current-pair")).getText()).includes("models--flashbar-e2e--tiny-target"),
    WAIT,
    "the engine did not switch to the downloaded pair",
  );
  await driver.wait(until.elementLocated(ENGINE_READY), 120_000);
  await shot("models-downloaded");
});

/** What the CSP blocked so far (main.ts counts it). */
async function cspViolations() {
  return Number(await driver.executeScript("return document.documentElement.dataset.cspViolations ?? 0"));
}

test("the CSP lets in all of the app's own content and nothing remote", async () => {
  // Every view has been shown with real content (markdown, highlighted
  // code, charts, downloads): none of it was blocked.
  assert.equal(await cspViolations(), 0, "the CSP blocked some of the app's own content");
  await tab("chat");
  await driver.executeScript(`
    const img = document.createElement("img");
    img.dataset.testid = "remote-image";
    img.src = "https://example.com/remote.png";
    document.body.append(img);`);
  await driver.wait(async () => (await cspViolations()) === 1, 5000, "a remote image was not blocked");
  await driver.executeScript(`document.querySelector('[data-testid="remote-image"]').remove()`);
});
