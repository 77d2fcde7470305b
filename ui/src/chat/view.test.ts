import { beforeEach, describe, expect, it, vi } from "vitest";
import type { ChatRequest } from "../api";
import { loadAll, newConversation, save, type StoragePort } from "./history";

const sent: ChatRequest[] = [];
vi.mock("../api", () => ({
  api: {
    chatSend: (request: ChatRequest) => {
      sent.push(request);
      return Promise.resolve(7);
    },
    chatStop: () => Promise.resolve(true),
  },
  errorText: String,
}));
const { ChatView } = await import("./view");

function memory(): StoragePort {
  const data = new Map<string, string>();
  return { getItem: (k) => data.get(k) ?? null, setItem: (k, v) => void data.set(k, v) };
}

function chat(text: string, now: number, enableThinking?: boolean) {
  const c = newConversation(now);
  c.title = text;
  c.turns.push({ role: "user", segments: [{ text, fromDraft: false }] });
  if (enableThinking !== undefined) c.enableThinking = enableThinking;
  return c;
}

const byTest = <T extends Element>(view: { root: HTMLElement }, id: string) =>
  view.root.querySelector(`[data-testid="${id}"]`) as T;
const flush = () => new Promise((resolve) => setTimeout(resolve, 0));

beforeEach(() => {
  sent.length = 0;
  vi.stubGlobal("requestAnimationFrame", (run: FrameRequestCallback) => {
    run(0);
    return 0;
  });
});

describe("the chat view", () => {
  it("keeps the thinking switch per chat, saved, and sends it", async () => {
    const storage = memory();
    const off = chat("off", 1000, false);
    const unset = chat("unset", 2000);
    save(storage, off);
    save(storage, unset);
    const view = new ChatView(storage);
    const toggle = byTest<HTMLSelectElement>(view, "thinking-switch");
    expect(toggle.value).toBe("default");
    const picker = byTest<HTMLSelectElement>(view, "history");
    picker.value = off.id;
    picker.dispatchEvent(new Event("change"));
    expect(toggle.value).toBe("off");
    toggle.value = "on";
    toggle.dispatchEvent(new Event("change"));
    expect(loadAll(storage).find((c) => c.id === off.id)?.enableThinking).toBe(true);
    // Reopened (a new view over the saved history): still on.
    const again = new ChatView(storage);
    expect(byTest<HTMLSelectElement>(again, "thinking-switch").value).toBe("on");
    byTest<HTMLTextAreaElement>(again, "chat-input").value = "think";
    byTest<HTMLButtonElement>(again, "send").click();
    await flush();
    expect(sent.at(-1)?.enable_thinking).toBe(true);
  });

  it("sends an unset switch as null", async () => {
    const view = new ChatView(memory());
    byTest<HTMLTextAreaElement>(view, "chat-input").value = "hi";
    byTest<HTMLButtonElement>(view, "send").click();
    await flush();
    expect(sent.at(-1)?.enable_thinking).toBeNull();
  });

  it("shows the thinking's tokens and time while it streams and after", async () => {
    const storage = memory();
    const view = new ChatView(storage);
    byTest<HTMLTextAreaElement>(view, "chat-input").value = "2+2?";
    byTest<HTMLButtonElement>(view, "send").click();
    await flush();
    const token = (reasoning: string, text: string, at: number) =>
      view.handle({ kind: "token", e: { job: 7, id: 1, from_draft: false, reasoning, text } }, at);
    token("Add", "", 1000);
    token(" them.", "", 3100);
    const summary = () => view.root.querySelector('[data-testid="thinking"] summary')?.textContent;
    expect(summary()).toBe("Thinking · 2 tokens · 2.1 s");
    token("", "4", 5200);
    expect(summary()).toBe("Thinking · 2 tokens · 4.2 s");
    token("", ".", 9000);
    const stats = {
      completion_tokens: 5,
      accepted_tokens: 0,
      tokens_per_second: 1,
      reasoning_tokens: 3,
    } as unknown as import("../api").Totals;
    view.handle({ kind: "done", e: { job: 7, finish_reason: "stop", reasoning: "Add them.", text: "4.", stats } });
    expect(summary()).toBe("Thinking · 3 tokens · 4.2 s");
    expect(loadAll(storage)[0]?.turns[1]?.thinking).toEqual({ tokens: 3, ms: 4200 });
  });
});
