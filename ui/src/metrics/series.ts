// The metrics panel's data: one point per decoding round, kept in a
// bounded window, as the series the charts draw.
import type { RoundEvent } from "../api";

export const MAX_POINTS = 300;

export interface Series {
  rounds: number[];
  acceptLength: number[];
  blockSize: number[];
  /** Realized speedup over plain decoding (null when not measured). */
  speedup: (number | null)[];
  tokensPerSecond: number[];
  gate: string[];
  thermal: string[];
}

export function emptySeries(): Series {
  return { rounds: [], acceptLength: [], blockSize: [], speedup: [], tokensPerSecond: [], gate: [], thermal: [] };
}

/** Appends one round; the oldest points leave past MAX_POINTS. */
export function addRound(series: Series, round: RoundEvent): void {
  const index = (series.rounds.at(-1) ?? 0) + 1;
  series.rounds.push(index);
  // Accept length: tokens committed by the round (accepted drafts + the
  // target's own token); a plain step commits one.
  series.acceptLength.push(round.committed);
  series.blockSize.push(round.block_size);
  series.speedup.push(round.mode === "dflash" ? round.speedup : 1);
  series.tokensPerSecond.push(Math.round(round.tokens_per_second * 10) / 10);
  series.gate.push(round.gate ?? (round.mode === "ar" ? "off" : "ungated"));
  series.thermal.push(round.thermal);
  if (series.rounds.length > MAX_POINTS) {
    for (const list of Object.values(series) as unknown[][]) list.shift();
  }
}

export interface Summary {
  rounds: number;
  meanAccept: number;
  meanSpeedup: number | null;
  lastGate: string;
  lastThermal: string;
}

export function summarize(series: Series): Summary {
  const n = series.rounds.length;
  const measured = series.speedup.filter((s): s is number => s !== null);
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
  return {
    rounds: n,
    meanAccept: mean(series.acceptLength),
    meanSpeedup: measured.length ? mean(measured) : null,
    lastGate: series.gate.at(-1) ?? "–",
    lastThermal: series.thermal.at(-1) ?? "–",
  };
}
