// The metrics panel's data: one point per decoding round, kept in a
// bounded window, as the series the charts draw.
import type { RoundEvent } from "../api";

export const MAX_POINTS = 300;

export interface Series {
  rounds: number[];
  acceptLength: number[];
  blockSize: number[];
  /** Realized speedup of DFlash rounds over plain decoding (null for plain
   *  rounds, and for DFlash rounds before plain decoding has been timed). */
  speedup: (number | null)[];
  /** 1 at plain-decoding rounds (drawn as their own points at 1×), else null. */
  plain: (number | null)[];
  /** What the round took, start to end (the engine's round_ms). */
  roundMs: number[];
  tokensPerSecond: number[];
  gate: string[];
  thermal: string[];
}

export function emptySeries(): Series {
  return {
    rounds: [], acceptLength: [], blockSize: [], speedup: [], plain: [], roundMs: [], tokensPerSecond: [],
    gate: [], thermal: [],
  };
}

/** Appends one round; the oldest points leave past MAX_POINTS. */
export function addRound(series: Series, round: RoundEvent): void {
  const index = (series.rounds.at(-1) ?? 0) + 1;
  const dflash = round.mode === "dflash";
  series.rounds.push(index);
  // Accept length: tokens committed by the round (accepted drafts + the
  // target's own token); a plain step commits one.
  series.acceptLength.push(round.committed);
  series.blockSize.push(round.block_size);
  series.speedup.push(dflash ? round.speedup : null);
  series.plain.push(dflash ? null : 1);
  series.roundMs.push(round.round_ms);
  series.tokensPerSecond.push(Math.round(round.tokens_per_second * 10) / 10);
  series.gate.push(round.gate ?? (dflash ? "ungated" : "off"));
  series.thermal.push(round.thermal);
  if (series.rounds.length > MAX_POINTS) {
    for (const list of Object.values(series) as unknown[][]) list.shift();
  }
}

/** Time DFlash saved (negative: lost) against plain decoding over the
 *  rounds shown. A DFlash round's speedup is committed tokens x the plain
 *  step time / its time, so plain decoding would have taken speedup x its
 *  time; a plain round saves nothing. Rounds whose speedup was not measured
 *  yet are left out of both sides. */
export interface Saved {
  ms: number;
  /** Plain decoding's time over ours for the same tokens. */
  overall: number;
}

export function timeSaved(series: Series): Saved | null {
  let ours = 0;
  let plain = 0;
  let measured = 0;
  series.roundMs.forEach((ms, i) => {
    const speedup = series.speedup[i];
    if (series.plain[i] !== null) {
      ours += ms;
      plain += ms;
    } else if (speedup !== null) {
      ours += ms;
      plain += speedup * ms;
      measured += 1;
    }
  });
  return measured > 0 && ours > 0 ? { ms: plain - ours, overall: plain / ours } : null;
}

export interface Summary {
  rounds: number;
  plainRounds: number;
  meanAccept: number;
  saved: Saved | null;
  lastGate: string;
  lastThermal: string;
}

export function summarize(series: Series): Summary {
  const n = series.rounds.length;
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
  return {
    rounds: n,
    plainRounds: series.plain.filter((p) => p !== null).length,
    meanAccept: mean(series.acceptLength),
    saved: timeSaved(series),
    lastGate: series.gate.at(-1) ?? "–",
    lastThermal: series.thermal.at(-1) ?? "–",
  };
}

/** The saved time as the panel's headline: "saved 1.24 s (1.83× plain decoding)". */
export function savedText(saved: Saved | null): string {
  if (saved === null) return "time saved: not measured yet";
  const seconds = Math.abs(saved.ms) / 1000;
  const amount = seconds >= 1 ? `${seconds.toFixed(2)} s` : `${Math.round(Math.abs(saved.ms))} ms`;
  return `${saved.ms >= 0 ? "saved" : "lost"} ${amount} vs plain decoding (${saved.overall.toFixed(2)}× overall)`;
}
