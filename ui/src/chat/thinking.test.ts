import { describe, expect, it } from "vitest";
import { showThinking, thinkingSection } from "./thinking";

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
});
