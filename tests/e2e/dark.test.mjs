// End-to-end, second pass: the same real app in dark mode (run.sh starts
// tauri-driver with GTK_THEME=Adwaita:dark, which WebKitGTK reports as
// prefers-color-scheme: dark). Fills each view with real content (a short
// chat answer, its metrics, the models and settings) and saves a
// screenshot of each in $E2E_SCREENSHOTS/dark, to compare with light/.
import { By, until } from "selenium-webdriver";
import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { after, before, test } from "node:test";
import { openApp } from "./driver.mjs";

// Generous: CI machines share their two cores, and a wait only costs time when it fails.
const WAIT = 30_000;
const APP = process.env.FLASHBAR_APP;
const SHOTS = path.join(process.env.E2E_SCREENSHOTS ?? "target/e2e-screenshots", "dark");
let driver;

const byTest = (id) => By.css(`[data-testid="${id}"]`);

async function shot(name) {
  await mkdir(SHOTS, { recursive: true });
  await writeFile(path.join(SHOTS, `${name}.png`), await driver.takeScreenshot(), "base64");
}

async function tab(view) {
  await driver.findElement(byTest(`tab-${view}`)).click();
  await driver.wait(until.elementLocated(By.css(`main[data-view="${view}"]`)), 5000);
}

before(async () => {
  assert.ok(APP, "FLASHBAR_APP must name the app binary");
  driver = await openApp(APP);
});

after(async () => {
  await driver?.quit();
});

test("every view in dark mode", async () => {
  const dark = await driver.executeScript("return matchMedia('(prefers-color-scheme: dark)').matches");
  assert.equal(dark, true, "GTK_THEME=Adwaita:dark did not reach the web view");
  // The page really is dark: its background's red channel is low.
  const background = await driver.executeScript("return getComputedStyle(document.body).backgroundColor");
  assert.ok(Number(/\d+/.exec(background)[0]) < 64, background);
  await tab("chat");
  // The light pass's conversation is kept (in the history file, across the
  // restart): it is open, with its answer. Start a new one.
  assert.match(await driver.findElement(byTest("turn-user")).getText(), /def fib/);
  assert.equal((await driver.findElements(byTest("turn-assistant"))).length, 1);
  await driver.findElement(byTest("new-chat")).click();
  await driver.wait(async () => (await driver.findElements(byTest("turn-assistant"))).length === 0, 5000);
  await driver.findElement(byTest("chat-input")).sendKeys("def add(a, b):");
  await driver.findElement(byTest("send")).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="turn-assistant"] footer')), 120_000);
  assert.match(await driver.findElement(byTest("turn-user")).getText(), /def add/);
  await shot("chat");
  await tab("metrics");
  const canvas = await driver.findElement(byTest("accept-chart"));
  await driver.wait(async () => Number(await canvas.getAttribute("data-points")) > 0, 5000);
  await shot("metrics");
  await tab("models");
  await driver.wait(until.elementLocated(byTest("pair-default")), WAIT);
  await driver.findElement(byTest("choose-default")).click();
  await driver.wait(until.elementLocated(By.css('[data-testid="verdict"][data-ok="true"]')), 30_000);
  await shot("models");
  await tab("server");
  await shot("server");
  await tab("settings");
  await shot("settings");
  const blocked = await driver.executeScript("return document.documentElement.dataset.cspViolations ?? 0");
  assert.equal(Number(blocked), 0, "the CSP blocked some of the app's own content");
});
