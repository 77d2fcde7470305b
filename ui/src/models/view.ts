// Models: the pair in use; the catalogue (sizes, memory, download with a
// progress bar, speed and ETA, cancel / resume, delete); the models on this
// machine with their disk use; and choosing a pair, with the doctor's
// verdict shown before it is used (using it reloads the engine).
import { api, errorText, type DownloadState, type EngineStatus, type PairInfo, type Settings, type Verdict } from "../api";
import { el } from "../dom";
import { repos, track } from "./downloads";
import { localList, pairRow, updatePairRow, type PairHandlers } from "./rows";

export class ModelsView {
  readonly root = el("section", { class: "models", "data-testid": "models" });
  private current = el("dl", { class: "pair", "data-testid": "current-pair" });
  private catalogue = el("ul", { class: "catalogue", "data-testid": "catalogue" });
  private local = el("div", { class: "local-box" });
  private message = el("p", { class: "message", "data-testid": "models-message" });
  private target = el("input", { placeholder: "default pair", "data-testid": "target-path" });
  private drafter = el("input", { placeholder: "none", "data-testid": "drafter-path" });
  private verdict = el("div", { class: "verdict", "data-testid": "verdict" });
  private use = el("button", { class: "primary", "data-testid": "use-pair", text: "Use this pair" });
  private pairs: PairInfo[] = [];
  private downloads = new Map<string, DownloadState>();
  private readonly handlers: PairHandlers = {
    download: (pair) => void this.run(() => api.modelsDownload(pair.id)),
    cancel: (pair) => void this.run(() => api.modelsCancel(pair.id)),
    delete: (pair) => void this.removeRepos(repos(pair)),
    choose: (pair) => void this.choose(pair),
  };

  constructor() {
    const check = el("button", { "data-testid": "check-pair", text: "Check" });
    check.addEventListener("click", () => void this.check());
    this.use.addEventListener("click", () => void this.apply());
    this.use.disabled = true;
    for (const input of [this.target, this.drafter]) input.addEventListener("input", () => (this.use.disabled = true));
    this.root.append(
      el("h2", { text: "In use" }),
      this.current,
      el("h2", { text: "Catalogue" }),
      this.catalogue,
      this.message,
      el("h2", { text: "On this machine" }),
      this.local,
      el("h2", { text: "Choose a pair" }),
      el("p", { class: "hint", text: "Choose a downloaded pair above, or give local folders of a target model and its DFlash drafter (both empty: the embedded pair)." }),
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
    try {
      const [settings, pairs, local, downloads] = await Promise.all([
        api.settingsGet(),
        api.modelsCatalogue(),
        api.modelsLocal(),
        api.modelsDownloads(),
      ]);
      if (!this.target.value && !this.drafter.value) {
        this.target.value = settings.target;
        this.drafter.value = settings.drafter;
      }
      this.pairs = pairs;
      this.downloads = new Map(downloads.map((d) => [d.pair, d]));
      this.renderCatalogue();
      this.local.replaceChildren(...localList(local, (repo) => void this.removeRepos([repo])));
    } catch (error) {
      this.message.textContent = errorText(error);
    }
  }

  /** A `models:download` event: redraw its row; a finished one relists. */
  onDownload(event: DownloadState): void {
    this.downloads = track(this.downloads, event);
    if (event.state === "done" || event.state === "cancelled" || event.state === "failed") {
      void this.refresh();
      return;
    }
    const pair = this.pairs.find((p) => p.id === event.pair);
    const row = this.catalogue.querySelector(`[data-testid="pair-${CSS.escape(event.pair)}"]`);
    if (pair && row instanceof HTMLElement) updatePairRow(row, pair, event, this.handlers);
  }

  private renderCatalogue(): void {
    this.catalogue.replaceChildren(...this.pairs.map((p) => pairRow(p, this.downloads.get(p.id), this.handlers)));
  }

  private async run(command: () => Promise<unknown>): Promise<void> {
    this.message.textContent = "";
    try {
      await command();
    } catch (error) {
      this.message.textContent = errorText(error);
    }
  }

  private async removeRepos(names: string[]): Promise<void> {
    await this.run(async () => {
      let freed = 0;
      for (const repo of names) freed += await api.modelsDelete(repo);
      for (const pair of this.pairs) if (repos(pair).some((r) => names.includes(r))) this.downloads.delete(pair.id);
      await this.refresh();
      this.message.textContent = `Deleted ${names.join(", ")}.`;
      this.message.dataset.freed = String(freed);
    });
  }

  /** Fills the folders of a downloaded pair and shows the doctor's verdict. */
  private async choose(pair: PairInfo): Promise<void> {
    this.verdict.textContent = "Checking…";
    try {
      const verdict = await api.modelsPairCheck(pair.id);
      this.target.value = pair.embedded ? "" : verdict.target;
      this.drafter.value = pair.embedded ? "" : (verdict.drafter ?? "");
      this.showVerdict(verdict);
      this.use.disabled = !verdict.ok;
    } catch (error) {
      this.fail(error);
    }
    this.verdict.scrollIntoView({ block: "nearest" });
  }

  private async check(): Promise<void> {
    this.verdict.textContent = "Checking…";
    try {
      const verdict = await api.modelsCheck(this.target.value.trim(), this.drafter.value.trim());
      this.showVerdict(verdict);
      this.use.disabled = !verdict.ok;
    } catch (error) {
      this.fail(error);
    }
  }

  private fail(error: unknown): void {
    this.verdict.replaceChildren(el("p", { class: "error", text: errorText(error) }));
    this.verdict.dataset.ok = "false";
    this.use.disabled = true;
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
