import { describe, expect, it } from "vitest";
import {
  dropLastAnswer,
  enableThinkingOf,
  loadAll,
  messagesOf,
  newConversation,
  remove,
  save,
  setThinkingChoice,
  thinkingChoice,
  titleFrom,
  type StoragePort,
} from "./history";

function memory(): StoragePort & { data: Map<string, string> } {
  const data = new Map<string, string>();
  return { data, getItem: (k) => data.get(k) ?? null, setItem: (k, v) => void data.set(k, v) };
}

describe("conversation history", () => {
  it("saves, restores newest first, and deletes", () => {
    const storage = memory();
    const older = newConversation(1000);
    older.turns.push({ role: "user", segments: [{ text: "first", fromDraft: false }] });
    const newer = newConversation(2000);
    newer.turns.push({ role: "user", segments: [{ text: "second", fromDraft: false }] });
    save(storage, older);
    save(storage, newer);
    expect(loadAll(storage).map((c) => c.id)).toEqual([newer.id, older.id]);
    expect(remove(storage, newer.id).map((c) => c.id)).toEqual([older.id]);
  });

  it("does not keep empty conversations and survives garbage", () => {
    const storage = memory();
    save(storage, newConversation());
    expect(loadAll(storage)).toEqual([]);
    storage.setItem("flashbar.conversations", "{not json");
    expect(loadAll(storage)).toEqual([]);
  });

  it("sends turns as messages, skipping failed answers, and regenerates the last answer", () => {
    const c = newConversation();
    c.turns.push({ role: "user", segments: [{ text: "hi", fromDraft: false }] });
    c.turns.push({ role: "assistant", segments: [], finish: "error: the model is not loaded" });
    expect(messagesOf(c)).toEqual([{ role: "user", content: "hi" }]);
    c.turns.push({ role: "user", segments: [{ text: "again", fromDraft: false }] });
    c.turns.push({ role: "assistant", segments: [{ text: "a", fromDraft: true }, { text: "b", fromDraft: false }] });
    expect(messagesOf(c).at(-1)).toEqual({ role: "assistant", content: "ab" });
    expect(dropLastAnswer(c)).toBe(true);
    expect(c.turns.at(-1)?.role).toBe("user");
    expect(dropLastAnswer(c)).toBe(false);
  });

  it("sends an answer's reasoning back with it", () => {
    const c = newConversation();
    c.turns.push({ role: "user", segments: [{ text: "2+2?", fromDraft: false }] });
    c.turns.push({ role: "assistant", segments: [{ text: "4", fromDraft: false }], reasoning: "Add them." });
    expect(messagesOf(c)).toEqual([
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "4", reasoning_content: "Add them." },
    ]);
    const storage = memory();
    save(storage, c);
    expect(loadAll(storage)[0]?.turns[1]?.reasoning).toBe("Add them.");
  });

  it("keeps each chat's thinking switch, unset by default, across saves", () => {
    const storage = memory();
    const c = newConversation(1000);
    c.turns.push({ role: "user", segments: [{ text: "hi", fromDraft: false }] });
    expect(thinkingChoice(c)).toBe("default");
    expect(enableThinkingOf(c)).toBeNull();
    setThinkingChoice(c, "off");
    expect(enableThinkingOf(c)).toBe(false);
    const other = newConversation(2000);
    other.turns.push({ role: "user", segments: [{ text: "yo", fromDraft: false }] });
    setThinkingChoice(other, "on");
    save(storage, c);
    save(storage, other);
    const [newer, older] = loadAll(storage);
    expect(newer && thinkingChoice(newer)).toBe("on");
    expect(newer && enableThinkingOf(newer)).toBe(true);
    expect(older && thinkingChoice(older)).toBe("off");
    // Back to the default: the field is gone, not saved as null.
    setThinkingChoice(c, "default");
    save(storage, c);
    const saved = loadAll(storage).find((x) => x.id === c.id);
    expect(saved && "enableThinking" in saved).toBe(false);
    expect(saved && thinkingChoice(saved)).toBe("default");
  });

  it("reads a history saved before the switch, or a bad value, as unset", () => {
    const storage = memory();
    storage.setItem(
      "flashbar.conversations",
      JSON.stringify([
        { id: "a", title: "t", system: "", temperature: 0.7, turns: [], updated: 1 },
        { id: "b", title: "t", system: "", temperature: 0.7, turns: [], updated: 2, enableThinking: "yes" },
      ]),
    );
    expect(loadAll(storage).map((c) => enableThinkingOf(c))).toEqual([null, null]);
  });

  it("titles a conversation by its first line", () => {
    expect(titleFrom("  def fib(n):\n  pass")).toBe("def fib(n):");
    expect(titleFrom("x".repeat(60))).toHaveLength(40);
    expect(titleFrom("   ")).toBe("New chat");
  });
});
