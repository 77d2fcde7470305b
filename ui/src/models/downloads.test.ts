import { describe, expect, it } from "vitest";
import type { DownloadState, PairInfo } from "../api";
import { actions, repos, rowState, track } from "./downloads";

function pair(over: Partial<PairInfo> = {}): PairInfo {
  return {
    id: "p", name: "P", memory_bytes: 1, fits: true, local: false, embedded: false,
    target: { id: "t", repo: "a/t", size_bytes: 10, estimate: false, path: null },
    drafter: { id: "d", repo: "a/d", size_bytes: 5, estimate: false, path: null },
    ...over,
  };
}

function event(state: DownloadState["state"], done = 0): DownloadState {
  return { pair: "p", state, file: "", done_bytes: done, total_bytes: 15, bytes_per_second: 0, eta_seconds: null, error: null };
}

describe("a catalogue row's state", () => {
  it("goes remote → running → done, and is then local", () => {
    let downloads = new Map<string, DownloadState>();
    expect(rowState(pair(), downloads.get("p"))).toBe("remote");
    expect(actions("remote")).toMatchObject({ download: true, cancel: false, choose: false });
    downloads = track(downloads, event("starting"));
    expect(rowState(pair(), downloads.get("p"))).toBe("starting");
    downloads = track(downloads, event("running", 5));
    expect(rowState(pair(), downloads.get("p"))).toBe("running");
    expect(actions("running")).toEqual({ download: false, cancel: true, resume: false, delete: false, choose: false });
    downloads = track(downloads, event("done", 15));
    // The catalogue is listed again after "done": the pair is now here.
    expect(rowState(pair({ local: true }), downloads.get("p"))).toBe("local");
    expect(actions("local")).toMatchObject({ delete: true, choose: true, download: false });
  });

  it("resumes after a cancel or a failure, and a new start replaces the old end", () => {
    let downloads = track(new Map(), event("cancelled", 7));
    expect(rowState(pair(), downloads.get("p"))).toBe("cancelled");
    expect(actions("cancelled")).toMatchObject({ resume: true, delete: true, cancel: false });
    downloads = track(downloads, event("starting"));
    expect(rowState(pair(), downloads.get("p"))).toBe("starting");
    expect(actions("failed")).toMatchObject({ resume: true });
  });

  it("never offers to download or delete the embedded pair", () => {
    const embedded = pair({ local: true, embedded: true, target: { id: "default", repo: null, size_bytes: 1, estimate: false, path: "/m" } });
    expect(rowState(embedded)).toBe("embedded");
    expect(actions("embedded")).toEqual({ download: false, cancel: false, resume: false, delete: false, choose: true });
    expect(repos(embedded)).toEqual(["a/d"]);
    expect(repos(pair())).toEqual(["a/t", "a/d"]);
  });
});
