// A thinking model's reasoning, shown as a collapsed "Thinking" section
// above its answer (docs/thinking-and-tools.md). Plain text: reasoning is
// not rendered as markdown.
import { el } from "../dom";

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

/** Shows `reasoning` (so far) in the section; none hides it. */
export function showThinking(section: HTMLDetailsElement, reasoning: string | undefined): void {
  section.hidden = !reasoning;
  const text = section.querySelector(".reasoning");
  if (text) text.textContent = reasoning ?? "";
}
