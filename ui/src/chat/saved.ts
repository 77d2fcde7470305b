// Where the conversations live: conversations.json in the app's data folder,
// which the app shell writes crash-safely (history_save: atomic write +
// rename). The UI keeps an in-memory copy for history.ts's StoragePort and
// writes every change through to the file: saves go one at a time, in
// order (a change made while a save runs is sent right after it; changes in
// between are superseded, each save carrying the whole history), and a
// failed save is reported, never dropped silently. Before this file, the
// history lived in the webview's localStorage: the first start moves it
// into the file.
import { HISTORY_KEY, type StoragePort } from "./history";

/** The history file, as the app shell offers it (api.historyLoad/Save). */
export interface HistoryFile {
  load(): Promise<string>;
  save(json: string): Promise<void>;
}

/** Told about save problems: a message, then null once a save works again. */
export type Report = (problem: string | null) => void;

function message(error: unknown): string {
  return typeof error === "string" ? error : error instanceof Error ? error.message : String(error);
}

function isArray(text: string, length?: number): boolean {
  try {
    const parsed: unknown = JSON.parse(text);
    return Array.isArray(parsed) && (length === undefined || parsed.length === length);
  } catch {
    return false;
  }
}

export class WriteThroughStorage implements StoragePort {
  private pending: string | null = null;
  private saving: Promise<void> | null = null;
  private failed = false;

  constructor(
    private text: string,
    private file: Pick<HistoryFile, "save">,
    private report: Report,
  ) {}

  getItem(key: string): string | null {
    return key === HISTORY_KEY ? this.text : null;
  }

  setItem(key: string, value: string): void {
    if (key !== HISTORY_KEY) throw new Error(`no storage for ${key}`);
    this.text = value;
    this.pending = value;
    this.saving ??= this.drain();
  }

  /** Resolves once every change so far is saved (or reported). */
  flushed(): Promise<void> {
    return this.saving ?? Promise.resolve();
  }

  private async drain(): Promise<void> {
    while (this.pending !== null) {
      const text = this.pending;
      this.pending = null;
      try {
        await this.file.save(text);
        if (this.failed) this.report(null);
        this.failed = false;
      } catch (error) {
        this.failed = true;
        this.report(`The conversations were not saved: ${message(error)}`);
      }
    }
    this.saving = null;
  }
}

/**
 * Loads the history file; on the first start, moves the old localStorage
 * history (`legacy`) into it. The legacy copy is removed only once the
 * file holds the conversations.
 */
export async function openHistory(
  file: HistoryFile,
  legacy: Pick<Storage, "getItem" | "removeItem"> | null,
  report: Report,
): Promise<WriteThroughStorage> {
  let text = await file.load();
  const old = legacy?.getItem(HISTORY_KEY) ?? null;
  if (legacy && old !== null) {
    if (!isArray(old)) {
      console.warn("flashbar: the old localStorage history is unreadable; left where it is");
    } else if (!isArray(text, 0)) {
      legacy.removeItem(HISTORY_KEY); // already moved (the file has conversations)
    } else {
      text = old;
      try {
        await file.save(old);
        legacy.removeItem(HISTORY_KEY);
      } catch (error) {
        report(`The conversations could not be moved to the history file: ${message(error)}`);
      }
    }
  }
  return new WriteThroughStorage(text, file, report);
}

/** A history that could not be loaded: shown empty, and never saved over the file. */
export function unsavedHistory(problem: string, report: Report): WriteThroughStorage {
  return new WriteThroughStorage(
    "[]",
    { save: () => Promise.reject(new Error(`the history could not be loaded (${problem}), so changes are not saved`)) },
    report,
  );
}
