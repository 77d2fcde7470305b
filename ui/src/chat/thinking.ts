// A thinking model's reasoning, shown as a collapsed "Thinking" section
// above its answer (docs/thinking-and-tools.md). Plain text: reasoning is
// not rendered as markdown. Its summary says how long the thinking was,
// while it streams and after: "Thinking · 312 tokens · 4.2 s".
import type { TokenEvent } from "../api";
import { el } from "../dom";

/** How long an answer's thinking was: its tokens (the `chat:token` events
 * that carried reasoning; the engine's count once the answer is done) and
 * the time from the first of them to the last, or to the answer's first
 * token. Kept with the answer (`Turn.thinking`). */
export interface ThinkingStats {
  tokens: number;
  ms: number;
}

/** Times a streaming answer's thinking; fed each `chat:token` event. */
export interface ThinkingClock {
  /** When the first reasoning token came (null: none yet). */
  first: number | null;
  /** Once the answer has begun, the thinking's time is final. */
  ended: boolean;
  stats?: ThinkingStats;
}

export function thinkingClock(): ThinkingClock {
  return { first: null, ended: false };
}

/** The clock after `token`, which came at `now` (ms, monotonic). Text
 * held back and released at the end (no token id) is reasoning but not a
 * token. */
export function tick(clock: ThinkingClock, token: Pick<TokenEvent, "id" | "reasoning" | "text">, now: number): ThinkingClock {
  if (clock.ended) return clock;
  const ended = token.text !== "";
  if (!token.reasoning) {
    if (!ended || clock.first === null || !clock.stats) return { ...clock, ended };
    return { first: clock.first, ended, stats: { tokens: clock.stats.tokens, ms: now - clock.first } };
  }
  const first = clock.first ?? now;
  const tokens = (clock.stats?.tokens ?? 0) + (token.id === null ? 0 : 1);
  return { first, ended, stats: { tokens, ms: now - first } };
}

/** The thinking's stats once the answer is done: the engine's count of
 * reasoning tokens (`Totals.reasoning_tokens`, which the footer shows)
 * replaces the events counted, which can miss a token that only opened or
 * closed the block (it releases no reasoning text). */
export function settled(stats: ThinkingStats | undefined, reasoningTokens: number): ThinkingStats | undefined {
  return stats && reasoningTokens > 0 ? { ...stats, tokens: reasoningTokens } : stats;
}

/** The section's summary: "Thinking", then the stats when known. */
export function thinkingSummary(stats: ThinkingStats | undefined): string {
  if (!stats) return "Thinking";
  const tokens = `${stats.tokens} ${stats.tokens === 1 ? "token" : "tokens"}`;
  return `Thinking · ${tokens} · ${(Math.max(0, stats.ms) / 1000).toFixed(1)} s`;
}

/** An answer's "Thinking" section, collapsed; hidden while it is empty. */
export function thinkingSection(): HTMLDetailsElement {
  const section = el(
    "details",
    { class: "thinking", "data-testid": "thinking" },
    el("summary", { text: "Thinking" }),
    el("div", { class: "reasoning" }),
  );
  section.hidden = true;
  return section;
}

/** Shows `reasoning` (so far) in the section, and `stats` in its summary;
 * no reasoning hides it. */
export function showThinking(section: HTMLDetailsElement, reasoning: string | undefined, stats?: ThinkingStats): void {
  section.hidden = !reasoning;
  const summary = section.querySelector("summary");
  if (summary) summary.textContent = thinkingSummary(stats);
  const text = section.querySelector(".reasoning");
  if (text) text.textContent = reasoning ?? "";
}
