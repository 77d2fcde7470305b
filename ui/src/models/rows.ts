// The Models view's list items: a catalogue pair (sizes, memory, its
// download's progress bar with speed and ETA, and the buttons its state
// allows) and a model in the local store (size, delete).
import type { DownloadState, LocalModels, PairInfo } from "../api";
import { el } from "../dom";
import { actions, rowState, type Actions, type RowState } from "./downloads";
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
  const size = (label: string, m: PairInfo["target"] | null) =>
    m ? `${label} ${m.estimate ? "~" : ""}${formatBytes(m.size_bytes)}` : `${label}: none`;
  const memory =
    pair.fits === false ? `needs ${formatBytes(pair.memory_bytes)} memory (more than here)` : `needs ${formatBytes(pair.memory_bytes)} memory`;
  const row = el(
    "li",
    { class: "pair-row", "data-testid": `pair-${pair.id}`, "data-state": state, "data-local": String(pair.local) },
    el("div", { class: "pair-head" }, el("strong", { text: pair.name }), el("span", { class: `badge ${state}`, text: STATE_TEXT[state] })),
    el("div", { class: "hint", text: [size("target", pair.target), size("drafter", pair.drafter), memory].join(" · ") }),
  );
  if (showsProgress(state) && download) row.append(progressBlock(download));
  row.append(actionButtons(pair, state, on));
  return row;
}

/** Redraws `row` for a new download event. While the buttons stay the same
 *  (every progress event of a running download) only the badge and the
 *  progress change: the buttons are kept, so a click on Cancel that spans
 *  an event (mouse down on one button, up on its replacement) is not lost. */
export function updatePairRow(row: HTMLElement, pair: PairInfo, download: DownloadState, on: PairHandlers): HTMLElement {
  const before = row.dataset.state as RowState | undefined;
  const state = rowState(pair, download);
  if (!before || !sameActions(actions(before), actions(state))) {
    const fresh = pairRow(pair, download, on);
    row.replaceWith(fresh);
    return fresh;
  }
  row.dataset.state = state;
  const badge = row.querySelector(".badge");
  if (badge) {
    badge.className = `badge ${state}`;
    badge.textContent = STATE_TEXT[state];
  }
  const progress = showsProgress(state) ? progressBlock(download) : null;
  const old = row.querySelector(".progress");
  if (old && progress) old.replaceWith(progress);
  else if (old) old.remove();
  else if (progress) row.querySelector(".actions")?.before(progress);
  return row;
}

function showsProgress(state: RowState): boolean {
  return state !== "local" && state !== "embedded" && state !== "remote";
}

function sameActions(a: Actions, b: Actions): boolean {
  return (Object.keys(a) as (keyof Actions)[]).every((k) => a[k] === b[k]);
}

function actionButtons(pair: PairInfo, state: RowState, on: PairHandlers): HTMLElement {
  const can = actions(state);
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
  return buttons;
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
