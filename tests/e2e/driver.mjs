// The WebDriver session every end-to-end test file starts: the app binary
// through tauri-driver (tests/e2e/run.sh starts it on port 4444), returned
// once the engine has loaded in the background and its banner says so.
import { Builder, By, until } from "selenium-webdriver";

export const ENGINE_READY = By.css('[data-testid="engine-status"][data-state="ready"]');

// WebKitWebDriver waits for ever on an app that exits at launch: bound it.
const LAUNCH_MS = 120_000;

export async function openApp(app) {
  let timer;
  const launched = new Builder()
    .usingServer("http://127.0.0.1:4444/")
    .withCapabilities({ browserName: "wry", "tauri:options": { application: app } })
    .build();
  const late = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`the app did not start within ${LAUNCH_MS / 1000} s (see the tauri-driver log)`)),
      LAUNCH_MS,
    );
  });
  const driver = await Promise.race([launched, late]).finally(() => clearTimeout(timer));
  await driver.wait(until.elementLocated(ENGINE_READY), 120_000);
  return driver;
}
