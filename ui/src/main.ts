// The web UI's entry: a tab bar over the five views (Chat, Models, Metrics,
// Server, Settings), the engine's load progress, and the wiring of the app shell's
// events to the views.
import { api, errorText, events, type EngineStatus, type View } from "./api";
import { openHistory, unsavedHistory } from "./chat/saved";
import { ChatView } from "./chat/view";
import { el } from "./dom";
import { MetricsView } from "./metrics/view";
import { ModelsView } from "./models/view";
import { ServerView } from "./server/view";
import { SettingsView } from "./settings/view";
import "highlight.js/styles/github.css";
import "./style.css";

// The CSP (src-tauri/tauri.conf.json) lets in nothing but the app's own
// files: anything it blocks is a bug (or an attack) worth seeing. Counted on
// <html data-csp-violations> for the e2e tests.
document.addEventListener("securitypolicyviolation", (event) => {
  console.error(`flashbar: the CSP blocked ${event.blockedURI || "inline content"} (${event.effectiveDirective})`);
  const root = document.documentElement;
  root.dataset.cspViolations = String(Number(root.dataset.cspViolations ?? "0") + 1);
});

const TABS: [View, string][] = [
  ["chat", "Chat"],
  ["models", "Models"],
  ["metrics", "Metrics"],
  ["server", "Server"],
  ["settings", "Settings"],
];

function engineBanner(banner: HTMLElement, status: EngineStatus): void {
  const seconds = (status.elapsed_ms / 1000).toFixed(1);
  banner.dataset.state = status.state;
  banner.replaceChildren();
  if (status.state === "loading") {
    banner.append(
      el("span", { text: `Loading ${status.model_id}… ${seconds} s` }),
      el("progress", { "aria-label": "Loading the model" }),
    );
  } else if (status.state === "ready") {
    const drafter = status.drafter ? " + DFlash drafter" : " (no drafter)";
    banner.append(el("span", { text: `${status.model_id}${drafter} · loaded in ${seconds} s` }));
  } else if (status.state === "failed") {
    banner.append(el("span", { class: "error", text: `Cannot load the model: ${status.error}` }));
  }
}

async function main(root: HTMLElement): Promise<void> {
  // Save problems go to the chat view (and the console), once it exists.
  let chat: ChatView | undefined;
  let early: string | null = null;
  const report = (problem: string | null) => {
    if (problem) console.error(`flashbar: ${problem}`);
    if (chat) chat.showHistoryProblem(problem);
    else early = problem;
  };
  const file = { load: api.historyLoad, save: api.historySave };
  const history = await openHistory(file, localStorage, report).catch((error: unknown) => {
    report(`The conversations could not be loaded: ${errorText(error)}`);
    return unsavedHistory(errorText(error), report);
  });
  chat = new ChatView(history);
  chat.showHistoryProblem(early);
  const models = new ModelsView();
  const metrics = new MetricsView();
  const settings = new SettingsView();
  const server = new ServerView();
  const views: Record<View, { root: HTMLElement }> = { chat, models, metrics, server, settings };
  const banner = el("div", { class: "engine", "data-testid": "engine-status" });
  const nav = el("nav", { role: "tablist" });
  const panel = el("main", { role: "tabpanel" });
  const select = (view: View) => {
    for (const tab of nav.children) tab.setAttribute("aria-selected", String((tab as HTMLElement).dataset.view === view));
    panel.replaceChildren(views[view].root);
    panel.dataset.view = view;
    if (view === "metrics") metrics.shown();
    if (view === "models") void models.refresh();
  };
  for (const [view, label] of TABS) {
    const tab = el("button", { role: "tab", "data-view": view, "data-testid": `tab-${view}`, text: label });
    tab.addEventListener("click", () => select(view));
    nav.append(tab);
  }
  root.replaceChildren(nav, banner, panel);
  select("chat");

  await Promise.all([
    events.engineStatus((s) => {
      engineBanner(banner, s);
      models.showEngine(s);
    }),
    events.token((e) => chat.handle({ kind: "token", e })),
    events.reloaded((e) => chat.handle({ kind: "reloaded", e })),
    events.done((e) => chat.handle({ kind: "done", e })),
    events.error((e) => chat.handle({ kind: "error", e })),
    events.round((round) => metrics.push(round)),
    events.serverStatus((s) => settings.showServer(s)),
    events.serverRequest((line) => server.push(line)),
    events.settingsChanged((s) => settings.show(s)),
    events.navigate((view) => select(view)),
    events.download((d) => models.onDownload(d)),
  ]);
  const [status, saved, serverStatus] = await Promise.all([api.engineStatus(), api.settingsGet(), api.serverStatus()]);
  engineBanner(banner, status);
  models.showEngine(status);
  settings.show(saved);
  settings.showServer(serverStatus);
  await server.load();
  await api.uiReady();
}

const root = document.getElementById("app");
if (root) {
  main(root).catch((error: unknown) => {
    root.append(el("p", { class: "error", text: `The app shell did not answer: ${String(error)}` }));
  });
}
