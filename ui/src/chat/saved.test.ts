import { describe, expect, it } from "vitest";
import { HISTORY_KEY, loadAll, newConversation, save } from "./history";
import { openHistory, unsavedHistory, WriteThroughStorage } from "./saved";

/** A history file whose saves finish when the test says so. */
function slowFile(initial = "[]") {
  const saves: { json: string; finish: () => void; fail: (e: unknown) => void }[] = [];
  const written: string[] = [];
  let text = initial;
  return {
    saves,
    written,
    get text() {
      return text;
    },
    load: () => Promise.resolve(text),
    save: (json: string) =>
      new Promise<void>((resolve, reject) => {
        saves.push({
          json,
          finish: () => {
            text = json;
            written.push(json);
            resolve();
          },
          fail: reject,
        });
      }),
  };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

function conversation(text: string, now: number) {
  const c = newConversation(now);
  c.turns.push({ role: "user", segments: [{ text, fromDraft: false }] });
  return c;
}

describe("the write-through history port", () => {
  it("reads from memory at once and saves one at a time, in order, the latest last", async () => {
    const file = slowFile();
    const storage = new WriteThroughStorage("[]", file, () => {});
    save(storage, conversation("a", 1));
    save(storage, conversation("b", 2));
    save(storage, conversation("c", 3));
    expect(loadAll(storage).map((c) => c.title)).toHaveLength(3);
    await tick();
    expect(file.saves).toHaveLength(1); // one in flight; b and c wait
    file.saves[0].finish();
    await tick();
    expect(file.saves).toHaveLength(2); // b was superseded by c
    file.saves[1].finish();
    await storage.flushed();
    expect(file.written).toHaveLength(2);
    expect(JSON.parse(file.text)).toHaveLength(3);
    expect(file.text).toBe(storage.getItem(HISTORY_KEY));
  });

  it("reports a failed save, and its recovery, instead of dropping it", async () => {
    const file = slowFile();
    const reports: (string | null)[] = [];
    const storage = new WriteThroughStorage("[]", file, (p) => reports.push(p));
    save(storage, conversation("a", 1));
    await tick();
    file.saves[0].fail("disk full");
    await storage.flushed();
    expect(reports).toEqual(["The conversations were not saved: disk full"]);
    save(storage, conversation("b", 2));
    await tick();
    file.saves[1].finish();
    await storage.flushed();
    expect(reports).toEqual(["The conversations were not saved: disk full", null]);
    expect(JSON.parse(file.text)).toHaveLength(2);
  });

  it("refuses other keys", () => {
    const storage = new WriteThroughStorage("[]", slowFile(), () => {});
    expect(() => storage.setItem("other", "x")).toThrow();
    expect(storage.getItem("other")).toBeNull();
  });

  it("never saves a history that could not be loaded", async () => {
    const reports: (string | null)[] = [];
    const storage = unsavedHistory("no shell", (p) => reports.push(p));
    save(storage, conversation("a", 1));
    await storage.flushed();
    expect(reports[0]).toContain("not saved");
  });
});

describe("moving the localStorage history into the file", () => {
  function legacy(value: string | null) {
    const data = new Map<string, string>(value === null ? [] : [[HISTORY_KEY, value]]);
    return { data, getItem: (k: string) => data.get(k) ?? null, removeItem: (k: string) => void data.delete(k) };
  }

  it("moves it on the first start, then removes it", async () => {
    const old = JSON.stringify([conversation("old", 1)]);
    const file = slowFile();
    const local = legacy(old);
    const opening = openHistory(file, local, () => {});
    await tick();
    file.saves[0].finish();
    const storage = await opening;
    expect(file.text).toBe(old);
    expect(storage.getItem(HISTORY_KEY)).toBe(old);
    expect(local.data.size).toBe(0);
  });

  it("keeps the old copy when the move fails, and shows its conversations", async () => {
    const old = JSON.stringify([conversation("old", 1)]);
    const file = slowFile();
    const local = legacy(old);
    const reports: (string | null)[] = [];
    const opening = openHistory(file, local, (p) => reports.push(p));
    await tick();
    file.saves[0].fail("read-only");
    const storage = await opening;
    expect(loadAll(storage)).toHaveLength(1);
    expect(local.data.get(HISTORY_KEY)).toBe(old);
    expect(reports[0]).toContain("read-only");
  });

  it("prefers a file that has conversations, and leaves garbage alone", async () => {
    const saved = JSON.stringify([conversation("saved", 2)]);
    const local = legacy(JSON.stringify([conversation("old", 1)]));
    const storage = await openHistory(slowFile(saved), local, () => {});
    expect(storage.getItem(HISTORY_KEY)).toBe(saved);
    expect(local.data.size).toBe(0);
    const garbage = legacy("{not json");
    const fresh = await openHistory(slowFile(), garbage, () => {});
    expect(fresh.getItem(HISTORY_KEY)).toBe("[]");
    expect(garbage.data.size).toBe(1);
  });
});
