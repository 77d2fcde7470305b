import { describe, expect, it } from "vitest";
import { settled, showThinking, thinkingClock, thinkingSection, thinkingSummary, tick, type ThinkingClock } from "./thinking";

/** Feeds `tokens` ([reasoning, text, at ms, id?]) to a new clock. */
function run(tokens: [string, string, number, (number | null)?][]): ThinkingClock {
  let clock = thinkingClock();
  for (const [reasoning, text, at, id] of tokens) clock = tick(clock, { id: id === undefined ? 1 : id, reasoning, text }, at);
  return clock;
}

describe("the Thinking section", () => {
  it("is hidden without reasoning, collapsed with it, and shows it as text", () => {
    const section = thinkingSection();
    expect(section.hidden).toBe(true);
    showThinking(section, "Add <b>them</b>.");
    expect(section.hidden).toBe(false);
    expect(section.open).toBe(false);
    expect(section.querySelector("summary")?.textContent).toBe("Thinking");
    expect(section.querySelector(".reasoning")?.textContent).toBe("Add <b>them</b>.");
    expect(section.querySelector("b")).toBeNull();
    showThinking(section, undefined);
    expect(section.hidden).toBe(true);
  });

  it("says the thinking's length and time in its summary", () => {
    const section = thinkingSection();
    showThinking(section, "Add them.", { tokens: 312, ms: 4230 });
    expect(section.querySelector("summary")?.textContent).toBe("Thinking · 312 tokens · 4.2 s");
    expect(section.open).toBe(false);
    expect(thinkingSummary({ tokens: 1, ms: 0 })).toBe("Thinking · 1 token · 0.0 s");
    expect(thinkingSummary(undefined)).toBe("Thinking");
  });
});

describe("the thinking clock", () => {
  it("counts reasoning tokens and times them while they stream", () => {
    let clock = run([["Add", "", 1000]]);
    expect(clock.stats).toEqual({ tokens: 1, ms: 0 });
    clock = tick(clock, { id: 2, reasoning: " them", text: "" }, 1800);
    expect(clock.stats).toEqual({ tokens: 2, ms: 800 });
    expect(clock.ended).toBe(false);
  });

  it("stops at the answer's first token, and nothing after moves it", () => {
    const clock = run([
      ["Add", "", 1000],
      [" them.", "", 2000],
      ["", "", 2500], // </think>: no text either way
      ["", "4", 3000],
      ["", " is it", 9000],
    ]);
    expect(clock.ended).toBe(true);
    expect(clock.stats).toEqual({ tokens: 2, ms: 2000 });
  });

  it("counts a token that ends the reasoning and begins the answer once", () => {
    const clock = run([
      ["Add", "", 1000],
      [" them.", "4", 1500],
      ["", "!", 5000],
    ]);
    expect(clock.stats).toEqual({ tokens: 2, ms: 500 });
  });

  it("has no stats for an answer without thinking", () => {
    const clock = run([
      ["", "4", 1000],
      ["", "!", 2000],
    ]);
    expect(clock.stats).toBeUndefined();
    expect(clock.ended).toBe(true);
  });

  it("times held-back reasoning released at the end but does not count it as a token", () => {
    const clock = run([
      ["Add", "", 1000],
      [" th", "", 1500, null],
    ]);
    expect(clock.stats).toEqual({ tokens: 1, ms: 500 });
  });

  it("takes the engine's token count once the answer is done", () => {
    expect(settled({ tokens: 310, ms: 4200 }, 312)).toEqual({ tokens: 312, ms: 4200 });
    expect(settled({ tokens: 3, ms: 10 }, 0)).toEqual({ tokens: 3, ms: 10 });
    expect(settled(undefined, 5)).toBeUndefined();
  });
});
