// Models: the pair in use (target + DFlash drafter) and its load state;
// choosing another pair of local folders, with the doctor's verdict shown
// before it is used (using it reloads the engine, with progress).
import { api, errorText, type EngineStatus, type Settings, type Verdict } from "../api";
import { el } from "../dom";

export class ModelsView {
  readonly root = el("section", { class: "models", "data-testid": "models" });
  private current = el("dl", { class: "pair", "data-testid": "current-pair" });
  private target = el("input", { placeholder: "default pair", "data-testid": "target-path" });
  private drafter = el("input", { placeholder: "none", "data-testid": "drafter-path" });
  private verdict = el("div", { class: "verdict", "data-testid": "verdict" });
  private use = el("button", { class: "primary", "data-testid": "use-pair", text: "Use this pair" });

  constructor() {
    const check = el("button", { "data-testid": "check-pair", text: "Check" });
    check.addEventListener("click", () => void this.check());
    this.use.addEventListener("click", () => void this.apply());
    this.use.disabled = true;
    for (const input of [this.target, this.drafter]) input.addEventListener("input", () => (this.use.disabled = true));
    this.root.append(
      el("h2", { text: "In use" }),
      this.current,
      el("h2", { text: "Choose a pair" }),
      el("p", { class: "hint", text: "Local folders of a target model and its DFlash drafter (leave both empty for the embedded pair)." }),
      el("label", {}, "Target ", this.target),
      el("label", {}, "Drafter ", this.drafter),
      el("div", { class: "actions" }, check, this.use),
      this.verdict,
    );
  }

  showEngine(status: EngineStatus): void {
    this.current.replaceChildren(
      el("dt", { text: "Target" }),
      el("dd", { text: status.target || "–" }),
      el("dt", { text: "Drafter" }),
      el("dd", { text: status.drafter ?? "none (plain decoding)" }),
      el("dt", { text: "State" }),
      el("dd", { text: status.error ? `${status.state}: ${status.error}` : status.state }),
    );
  }

  async refresh(): Promise<void> {
    const settings = await api.settingsGet();
    if (!this.target.value && !this.drafter.value) {
      this.target.value = settings.target;
      this.drafter.value = settings.drafter;
    }
  }

  private async check(): Promise<void> {
    this.verdict.textContent = "Checking…";
    try {
      const verdict = await api.modelsCheck(this.target.value.trim(), this.drafter.value.trim());
      this.showVerdict(verdict);
      this.use.disabled = !verdict.ok;
    } catch (error) {
      this.verdict.replaceChildren(el("p", { class: "error", text: errorText(error) }));
      this.verdict.dataset.ok = "false";
      this.use.disabled = true;
    }
  }

  private showVerdict(verdict: Verdict): void {
    const list = el("ul", { class: "findings" });
    for (const f of verdict.findings) {
      list.append(el("li", { class: f.ok ? "ok" : "error" }, `${f.ok ? "✓" : "✗"} ${f.check}: ${f.detail}`));
    }
    const head = verdict.ok ? "Doctor: this pair can run here." : "Doctor: this pair cannot be used.";
    this.verdict.replaceChildren(el("p", { class: verdict.ok ? "ok" : "error", text: head }), list);
    this.verdict.dataset.ok = String(verdict.ok);
  }

  private async apply(): Promise<void> {
    try {
      const settings: Settings = await api.settingsGet();
      await api.settingsSet({ ...settings, target: this.target.value.trim(), drafter: this.drafter.value.trim() });
      this.use.disabled = true;
    } catch (error) {
      this.verdict.append(el("p", { class: "error", text: errorText(error) }));
    }
  }
}
