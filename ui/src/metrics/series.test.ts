import { describe, expect, it } from "vitest";
import type { RoundEvent } from "../api";
import { addRound, emptySeries, MAX_POINTS, summarize } from "./series";

function round(over: Partial<RoundEvent>): RoundEvent {
  return {
    job: 1, mode: "dflash", block_size: 16, accepted: 3, committed: 4, draft_ms: 2, verify_ms: 6,
    rollback_ms: 0, speedup: 1.8, gate: "speculating", thermal: "nominal", tokens_per_second: 500, ...over,
  };
}

describe("metrics series", () => {
  it("adds one point per round with its accept length, speedup and states", () => {
    const s = emptySeries();
    addRound(s, round({ mode: "ar", block_size: 1, accepted: 0, committed: 1, speedup: null, gate: "calibrating" }));
    addRound(s, round({}));
    addRound(s, round({ speedup: null, gate: null }));
    expect(s.rounds).toEqual([1, 2, 3]);
    expect(s.acceptLength).toEqual([1, 4, 4]);
    expect(s.speedup).toEqual([1, 1.8, null]);
    expect(s.gate).toEqual(["calibrating", "speculating", "ungated"]);
    const sum = summarize(s);
    expect(sum.meanAccept).toBe(3);
    expect(sum.meanSpeedup).toBeCloseTo(1.4);
    expect(sum.lastThermal).toBe("nominal");
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
    expect(summarize(emptySeries())).toMatchObject({ rounds: 0, meanSpeedup: null, lastGate: "–" });
  });
});
