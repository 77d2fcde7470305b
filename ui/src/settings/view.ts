// Settings: the local server (switch, port, API key, its address and
// state), the speculation mode, idle unload, launch at login, the tray's live speed,
// where the logs are. Every change is saved and
// applied by the app shell at once; refused values show the reason.
import { api, errorText, type ServerStatus, type Settings } from "../api";
import { el } from "../dom";

export class SettingsView {
  readonly root = el("section", { class: "settings", "data-testid": "settings" });
  private settings: Settings | null = null;
  private server = el("input", { type: "checkbox", "data-testid": "server-toggle" });
  private port = el("input", { type: "number", min: "1024", max: "65535", "data-testid": "port" });
  private key = el("input", { type: "password", placeholder: "none", autocomplete: "off", "data-testid": "api-key" });
  private speculation = el("select", { "data-testid": "speculation" });
  private idleUnload = el("select", { "data-testid": "idle-unload" });
  private login = el("input", { type: "checkbox", "data-testid": "launch-at-login" });
  private traySpeed = el("input", { type: "checkbox", "data-testid": "tray-speed" });
  private status = el("p", { class: "server-status", "data-testid": "server-status" });
  private message = el("p", { class: "message", role: "status", "data-testid": "settings-message" });
  private logPath = el("code", { class: "path", "data-testid": "log-path" });
  private openLogs = el("button", { type: "button", text: "Open", "data-testid": "open-logs" });

  constructor() {
    for (const [value, label] of [
      ["auto", "Auto"],
      ["dflash", "Always DFlash"],
      ["off", "Off (plain decoding)"],
    ]) {
      this.speculation.append(el("option", { value, text: label }));
    }
    for (const [value, label] of [
      ["5", "after 5 minutes"],
      ["15", "after 15 minutes"],
      ["30", "after 30 minutes"],
      ["60", "after 1 hour"],
      ["240", "after 4 hours"],
      ["0", "never"],
    ]) {
      this.idleUnload.append(el("option", { value, text: label }));
    }
    this.root.append(
      el("h2", { text: "Local server" }),
      el("p", { class: "hint", text: "An OpenAI-compatible endpoint on this machine, sharing the chat's model." }),
      el("label", { class: "switch" }, this.server, " Serve the model over HTTP"),
      el("label", {}, "Port ", this.port),
      el("label", {}, "API key ", this.key),
      this.status,
      el("h2", { text: "Generation" }),
      el("label", {}, "Speculation ", this.speculation),
      el("p", { class: "hint", text: "Auto drafts with DFlash while it measurably beats plain decoding, and falls back when it does not." }),
      el("label", {}, "Unload when idle ", this.idleUnload),
      el("p", { class: "hint", text: "Frees the model's memory after a while without requests; the next message or HTTP request loads it again." }),
      el("h2", { text: "System" }),
      el("label", { class: "switch" }, this.login, " Launch at login"),
      el("label", { class: "switch" }, this.traySpeed, " Show tokens/s and the DFlash speedup in the menu bar while generating"),
      el("p", { class: "logs" }, "Logs ", this.logPath, " ", this.openLogs),
      el("p", { class: "hint", text: "No prompt or answer text is ever logged, nor any API key." }),
      this.message,
    );
    void api.logsFolder().then((path) => (this.logPath.textContent = path), () => undefined);
    this.openLogs.addEventListener("click", () => {
      api.logsOpen().catch((error) => (this.message.textContent = errorText(error)));
    });
    this.server.addEventListener("change", () => this.apply());
    this.speculation.addEventListener("change", () => this.apply());
    this.idleUnload.addEventListener("change", () => this.apply());
    this.login.addEventListener("change", () => this.apply());
    this.traySpeed.addEventListener("change", () => this.apply());
    this.port.addEventListener("change", () => this.apply());
    this.key.addEventListener("change", () => this.apply());
  }

  show(settings: Settings): void {
    this.settings = settings;
    this.server.checked = settings.server_enabled;
    this.port.value = String(settings.port);
    this.key.value = settings.api_key;
    this.speculation.value = settings.speculation;
    this.login.checked = settings.launch_at_login;
    this.traySpeed.checked = settings.tray_speed;
    const minutes = String(settings.idle_unload_minutes);
    if (![...this.idleUnload.options].some((o) => o.value === minutes)) {
      this.idleUnload.append(el("option", { value: minutes, text: `after ${minutes} minutes` }));
    }
    this.idleUnload.value = minutes;
  }

  showServer(status: ServerStatus): void {
    this.status.textContent = status.running
      ? `Running at ${status.address}`
      : status.error
        ? `Not running: ${status.error}`
        : "Off";
    this.status.dataset.running = String(status.running);
    this.status.dataset.address = status.address ?? "";
  }

  private async apply(): Promise<void> {
    if (!this.settings) return;
    const port = Number(this.port.value);
    if (!Number.isInteger(port) || port < 1024 || port > 65535) {
      this.message.textContent = `port must be between 1024 and 65535, not ${this.port.value || "empty"}`;
      return;
    }
    const wanted: Settings = {
      ...this.settings,
      server_enabled: this.server.checked,
      port,
      api_key: this.key.value.trim(),
      speculation: this.speculation.value as Settings["speculation"],
      launch_at_login: this.login.checked,
      tray_speed: this.traySpeed.checked,
      idle_unload_minutes: Number(this.idleUnload.value),
    };
    this.message.textContent = "Applying…";
    try {
      this.show(await api.settingsSet(wanted));
      this.message.textContent = "Saved.";
    } catch (error) {
      this.message.textContent = errorText(error);
      this.show(this.settings);
    }
    this.showServer(await api.serverStatus());
  }
}
