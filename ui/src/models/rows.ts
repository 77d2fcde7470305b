// The Models view's list items: a catalogue pair (sizes, memory, its
// download's progress bar with speed and ETA, and the buttons its state
// allows) and a model in the local store (size, delete).
import type { DownloadState, LocalModels, PairInfo } from "../api";
import { el } from "../dom";
import { actions, rowState } from "./downloads";
import { formatBytes, formatEta, formatSpeed, percent } from "./format";

export interface PairHandlers {
  download(pair: PairInfo): void;
  cancel(pair: PairInfo): void;
  delete(pair: PairInfo): void;
  choose(pair: PairInfo): void;
}

/** A button that asks to be clicked twice (deleting is not undone). */
export function confirmButton(label: string, testid: string, run: () => void): HTMLButtonElement {
  const button = el("button", { "data-testid": testid, text: label });
  button.addEventListener("click", () => {
    if (button.dataset.armed === "true") return run();
    button.dataset.armed = "true";
    button.textContent = `${label}? Click again`;
  });
  return button;
}

const STATE_TEXT: Record<string, string> = {
  embedded: "built in",
  local: "downloaded",
  remote: "not downloaded",
  starting: "starting…",
  running: "downloading…",
  cancelled: "paused",
  failed: "failed",
};

export function pairRow(pair: PairInfo, download: DownloadState | undefined, on: PairHandlers): HTMLLIElement {
  const state = rowState(pair, download);
  const can = actions(state);
  const size = (label: string, m: PairInfo["target"] | null) =>
    m ? `${label} ${m.estimate ? "~" : ""}${formatBytes(m.size_bytes)}` : `${label}: none`;
  const memory =
    pair.fits === false ? `needs ${formatBytes(pair.memory_bytes)} memory (more than here)` : `needs ${formatBytes(pair.memory_bytes)} memory`;
  const buttons = el("div", { class: "actions" });
  const button = (label: string, testid: string, run: () => void, primary = false) => {
    const b = el("button", { "data-testid": `${testid}-${pair.id}`, text: label, class: primary ? "primary" : undefined });
    b.addEventListener("click", run);
    buttons.append(b);
  };
  if (can.download) button("Download", "download", () => on.download(pair), true);
  if (can.resume) button("Resume", "resume", () => on.download(pair), true);
  if (can.cancel) button("Cancel", "cancel", () => on.cancel(pair));
  if (can.delete) buttons.append(confirmButton("Delete", `delete-${pair.id}`, () => on.delete(pair)));
  if (can.choose) button("Choose", "choose", () => on.choose(pair));
  const row = el(
    "li",
    { class: "pair-row", "data-testid": `pair-${pair.id}`, "data-state": state, "data-local": String(pair.local) },
    el("div", { class: "pair-head" }, el("strong", { text: pair.name }), el("span", { class: `badge ${state}`, text: STATE_TEXT[state] })),
    el("div", { class: "hint", text: [size("target", pair.target), size("drafter", pair.drafter), memory].join(" · ") }),
  );
  if (download && state !== "local" && state !== "embedded" && state !== "remote") row.append(progressBlock(download));
  row.append(buttons);
  return row;
}

function progressBlock(d: DownloadState): HTMLElement {
  const bar = el("progress", { class: "download", max: "100", "data-testid": "download-progress" });
  bar.value = percent(d.done_bytes, d.total_bytes);
  const parts = [`${formatBytes(d.done_bytes)} of ${formatBytes(d.total_bytes)}`];
  if (d.state === "running") parts.push(formatSpeed(d.bytes_per_second), `${formatEta(d.eta_seconds)} left`);
  const text = d.error ?? parts.join(" · ");
  return el(
    "div",
    { class: "progress" },
    bar,
    el("div", { class: d.error ? "error" : "hint", "data-testid": "download-text", text }),
  );
}

export function localList(local: LocalModels, remove: (repo: string) => void): HTMLElement[] {
  const free = local.free_bytes === null ? "" : `, ${formatBytes(local.free_bytes)} free`;
  const usage = el("p", {
    class: "hint",
    "data-testid": "disk-use",
    text: `${formatBytes(local.used_bytes)} in ${local.store}${free}`,
  });
  const list = el("ul", { class: "local", "data-testid": "local-models" });
  if (local.repos.length === 0) list.append(el("li", { class: "empty", text: "No downloaded models yet." }));
  for (const repo of local.repos) {
    const partial = repo.incomplete_bytes > 0 ? ` (${formatBytes(repo.incomplete_bytes)} unfinished)` : "";
    list.append(
      el(
        "li",
        { "data-testid": `local-${repo.repo}` },
        el("span", { text: `${repo.repo} · ${formatBytes(repo.size_bytes)}${partial}` }),
        confirmButton("Delete", `delete-local-${repo.repo}`, () => remove(repo.repo)),
      ),
    );
  }
  return [usage, list];
}
