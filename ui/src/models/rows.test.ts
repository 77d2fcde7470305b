import { describe, expect, it } from "vitest";
import type { DownloadState, PairInfo } from "../api";
import { pairRow, updatePairRow, type PairHandlers } from "./rows";

const pair: PairInfo = {
  id: "p", name: "P", memory_bytes: 1, fits: true, local: false, embedded: false,
  target: { id: "t", repo: "a/t", size_bytes: 10, estimate: false, path: null },
  drafter: { id: "d", repo: "a/d", size_bytes: 5, estimate: false, path: null },
};

function event(state: DownloadState["state"], done: number): DownloadState {
  return { pair: "p", state, file: "model.safetensors", done_bytes: done, total_bytes: 15_000_000, bytes_per_second: 1e6, eta_seconds: 3, error: null };
}

function handlers(cancelled: string[]): PairHandlers {
  return { download: () => {}, cancel: (p) => cancelled.push(p.id), delete: () => {}, choose: () => {} };
}

describe("a catalogue row during a download", () => {
  it("keeps its Cancel button across progress events, so a click spanning one still cancels", () => {
    const cancelled: string[] = [];
    const on = handlers(cancelled);
    const list = document.createElement("ul");
    let row: HTMLElement = pairRow(pair, event("starting", 0), on);
    list.append(row);
    const cancel = row.querySelector('[data-testid="cancel-p"]') as HTMLButtonElement;
    row = updatePairRow(row, pair, event("running", 3_000_000), on);
    // Mouse down before the event, up after it: the same button gets both.
    cancel.dispatchEvent(new MouseEvent("mousedown"));
    row = updatePairRow(row, pair, event("running", 6_000_000), on);
    expect(row.querySelector('[data-testid="cancel-p"]')).toBe(cancel);
    cancel.click();
    expect(cancelled).toEqual(["p"]);
    // The badge and the bar did move.
    expect(row.dataset.state).toBe("running");
    expect(row.querySelector(".badge")?.textContent).toBe("downloading…");
    expect((row.querySelector("progress") as HTMLProgressElement).value).toBe(40);
    expect(row.querySelector('[data-testid="download-text"]')?.textContent).toMatch(/^6\.0 MB of 15 MB · 1\.0 MB\/s/);
    expect(row.querySelectorAll(".progress")).toHaveLength(1);
    expect(list.children).toHaveLength(1);
  });

  it("swaps its buttons when the download ends", () => {
    const on = handlers([]);
    const list = document.createElement("ul");
    let row: HTMLElement = pairRow(pair, event("running", 3_000_000), on);
    list.append(row);
    row = updatePairRow(row, pair, event("cancelled", 3_000_000), on);
    expect(list.firstElementChild).toBe(row);
    expect(row.dataset.state).toBe("cancelled");
    expect(row.querySelector('[data-testid="cancel-p"]')).toBeNull();
    expect(row.querySelector('[data-testid="resume-p"]')).not.toBeNull();
    expect(row.querySelector('[data-testid="download-text"]')?.textContent).toBe("3.0 MB of 15 MB");
  });
});
