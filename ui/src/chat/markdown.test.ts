import { describe, expect, it } from "vitest";
import { DRAFT_CLOSE, DRAFT_OPEN, markedSource, renderAnswer, renderMarkdown } from "./markdown";

describe("markdown", () => {
  it("renders GFM and highlights fenced code", () => {
    const html = renderMarkdown("**bold**\n\n```python\ndef fib(n):\n    return n\n```");
    expect(html).toContain("<strong>bold</strong>");
    expect(html).toContain('class="hljs language-python"');
    expect(html).toContain('<span class="hljs-keyword">def</span>');
  });

  it("strips scripts and event handlers from model output", () => {
    const html = renderMarkdown('hi <script>alert(1)</script><img src="x" onerror="alert(2)">');
    expect(html).not.toContain("<script");
    expect(html).not.toContain("onerror");
  });

  it("keeps draft markers inside lines", () => {
    const source = markedSource([
      { text: "plain ", fromDraft: false },
      { text: "a\nb", fromDraft: true },
    ]);
    expect(source).toBe(`plain ${DRAFT_OPEN}a${DRAFT_CLOSE}\n${DRAFT_OPEN}b${DRAFT_CLOSE}`);
  });

  it("tints exactly the drafted text, also inside code and emphasis", () => {
    const root = document.createElement("div");
    renderAnswer(root, [
      { text: "Here is ", fromDraft: false },
      { text: "**very** fast", fromDraft: true },
      { text: " code:\n\n```rust\nfn ", fromDraft: false },
      { text: "main() {}", fromDraft: true },
      { text: "\n```", fromDraft: false },
    ]);
    const drafts = [...root.querySelectorAll(".draft")].map((n) => n.textContent);
    expect(drafts.join("")).toBe("very fastmain() {}");
    expect(root.querySelector("strong .draft")?.textContent).toBe("very");
    expect(root.querySelector("code")?.textContent).toBe("fn main() {}\n");
    expect(root.textContent).not.toMatch(/[\uE000\uE001]/);
  });
});
