// Markdown for answers: marked (GFM) + highlight.js for code blocks,
// sanitized with DOMPurify (model output is untrusted). Text from accepted
// drafts is marked in the source with private-use characters, which survive
// rendering; `markDrafts` then wraps those stretches of the rendered text in
// <span class="draft">, text node by text node, so markup is never broken.
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import typescript from "highlight.js/lib/languages/typescript";
import { Marked } from "marked";
import { markedHighlight } from "marked-highlight";

hljs.registerLanguage("bash", bash);
hljs.registerLanguage("javascript", javascript);
hljs.registerLanguage("json", json);
hljs.registerLanguage("python", python);
hljs.registerLanguage("rust", rust);
hljs.registerLanguage("typescript", typescript);

export const DRAFT_OPEN = "\uE000";
export const DRAFT_CLOSE = "\uE001";

const marked = new Marked(
  { gfm: true, breaks: true },
  markedHighlight({
    langPrefix: "hljs language-",
    highlight(code, lang) {
      const language = hljs.getLanguage(lang) ? lang : "plaintext";
      return language === "plaintext" ? escapeHtml(code) : hljs.highlight(code, { language }).value;
    },
  }),
);

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** A piece of an answer and whether it came from an accepted draft. */
export interface Segment {
  text: string;
  fromDraft: boolean;
}

/** The markdown source with drafted stretches between markers; a marker
 * pair never spans a line break, so block structure is left alone. */
export function markedSource(segments: Segment[]): string {
  let out = "";
  for (const { text, fromDraft } of segments) {
    if (!fromDraft) {
      out += text;
      continue;
    }
    out += text
      .split("\n")
      .map((line) => (line ? DRAFT_OPEN + line + DRAFT_CLOSE : line))
      .join("\n");
  }
  return out;
}

/** Sanitized HTML for a (possibly marked) markdown source. */
export function renderMarkdown(source: string): string {
  const html = marked.parse(source, { async: false });
  return DOMPurify.sanitize(html);
}

/** Replaces the markers under `root` with <span class="draft"> wrappers. */
export function markDrafts(root: HTMLElement): void {
  const walker = root.ownerDocument.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const nodes: Text[] = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node as Text);
  let inDraft = false;
  for (const node of nodes) {
    const text = node.data;
    if (!inDraft && !text.includes(DRAFT_OPEN) && !text.includes(DRAFT_CLOSE)) continue;
    const parts = document.createDocumentFragment();
    let run = "";
    const flush = () => {
      if (!run) return;
      if (inDraft) {
        const span = root.ownerDocument.createElement("span");
        span.className = "draft";
        span.textContent = run;
        parts.append(span);
      } else {
        parts.append(run);
      }
      run = "";
    };
    for (const ch of text) {
      if (ch === DRAFT_OPEN || ch === DRAFT_CLOSE) {
        flush();
        inDraft = ch === DRAFT_OPEN;
      } else {
        run += ch;
      }
    }
    flush();
    node.replaceWith(parts);
  }
}

/** Renders segments into `root`: markdown, highlighted code, draft colour. */
export function renderAnswer(root: HTMLElement, segments: Segment[]): void {
  root.innerHTML = renderMarkdown(markedSource(segments));
  markDrafts(root);
}
