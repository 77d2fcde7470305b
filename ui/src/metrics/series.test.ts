import { describe, expect, it } from "vitest";
import type { RoundEvent } from "../api";
import { addRound, emptySeries, MAX_POINTS, savedText, summarize, timeSaved } from "./series";

function round(over: Partial<RoundEvent>): RoundEvent {
  const parts = { draft_ms: 2, verify_ms: 6, rollback_ms: 0, ...over };
  return {
    job: 1, mode: "dflash", block_size: 16, accepted: 3, committed: 4, speedup: 1.8, gate: "speculating",
    thermal: "nominal", tokens_per_second: 500, round_ms: parts.draft_ms + parts.verify_ms + parts.rollback_ms,
    ...parts, ...over,
  };
}

const plainRound = (over: Partial<RoundEvent> = {}) =>
  round({ mode: "ar", block_size: 1, accepted: 0, committed: 1, draft_ms: 0, verify_ms: 5, speedup: null, gate: "calibrating", ...over });

describe("metrics series", () => {
  it("adds one point per round with its accept length, speedup and states", () => {
    const s = emptySeries();
    addRound(s, plainRound());
    addRound(s, round({}));
    addRound(s, round({ speedup: null, gate: null }));
    expect(s.rounds).toEqual([1, 2, 3]);
    expect(s.acceptLength).toEqual([1, 4, 4]);
    // Plain rounds are not drawn as a speedup of 1: they are their own points.
    expect(s.speedup).toEqual([null, 1.8, null]);
    expect(s.plain).toEqual([1, null, null]);
    expect(s.roundMs).toEqual([5, 8, 8]);
    expect(s.gate).toEqual(["calibrating", "speculating", "ungated"]);
    const sum = summarize(s);
    expect(sum.meanAccept).toBe(3);
    expect(sum.plainRounds).toBe(1);
    expect(sum.lastThermal).toBe("nominal");
  });

  it("sums the time saved against plain decoding over measured rounds", () => {
    const s = emptySeries();
    addRound(s, plainRound()); // 5 ms, saves nothing
    addRound(s, round({ speedup: 2 })); // 8 ms that plain decoding does in 16
    addRound(s, round({ speedup: 0.5, verify_ms: 2 })); // 4 ms that plain does in 2
    addRound(s, round({ speedup: null })); // not measured: left out
    const saved = timeSaved(s)!;
    expect(saved.ms).toBeCloseTo(8 - 2);
    expect(saved.overall).toBeCloseTo((5 + 16 + 2) / (5 + 8 + 4));
    expect(savedText(saved)).toBe("saved 6 ms vs plain decoding (1.35× overall)");
  });

  it("says time lost when DFlash was slower, in seconds past one", () => {
    const s = emptySeries();
    addRound(s, round({ speedup: 0.5, draft_ms: 1000, verify_ms: 1500 }));
    expect(savedText(timeSaved(s))).toBe("lost 1.25 s vs plain decoding (0.50× overall)");
  });

  it("has no saved time without a measured DFlash round", () => {
    const s = emptySeries();
    addRound(s, plainRound());
    addRound(s, round({ speedup: null }));
    expect(timeSaved(s)).toBeNull();
    expect(savedText(null)).toBe("time saved: not measured yet");
  });

  it("keeps a bounded window", () => {
    const s = emptySeries();
    for (let i = 0; i < MAX_POINTS + 5; i++) addRound(s, round({ committed: i }));
    expect(s.rounds).toHaveLength(MAX_POINTS);
    expect(s.rounds[0]).toBe(6);
    expect(s.acceptLength[0]).toBe(5);
    expect(new Set(Object.values(s).map((l) => l.length)).size).toBe(1);
  });

  it("summarizes nothing without rounds", () => {
    expect(summarize(emptySeries())).toMatchObject({ rounds: 0, saved: null, lastGate: "–" });
  });
});
