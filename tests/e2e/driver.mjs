// The WebDriver session every end-to-end test file starts: the app binary
// through tauri-driver (tests/e2e/run.sh starts it on port 4444), returned
// once the engine has loaded in the background and its banner says so.
import { Builder, By, until } from "selenium-webdriver";

export const ENGINE_READY = By.css('[data-testid="engine-status"][data-state="ready"]');

export async function openApp(app) {
  const driver = await new Builder()
    .usingServer("http://127.0.0.1:4444/")
    .withCapabilities({ browserName: "wry", "tauri:options": { application: app } })
    .build();
  await driver.wait(until.elementLocated(ENGINE_READY), 120_000);
  return driver;
}
