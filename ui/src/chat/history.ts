// Conversations: pure data + a storage port (one JSON array under
// HISTORY_KEY), so it is tested without a window. The app's port
// (saved.ts) writes through to conversations.json in the app's data folder,
// so the history survives restarts and crashes.
import type { Segment } from "./markdown";
import type { ThinkingStats } from "./thinking";

export interface Turn {
  role: "user" | "assistant";
  /** The answer's pieces (user turns: one piece). */
  segments: Segment[];
  /** Set on answers: why they ended, or the error. */
  finish?: string;
  /** A thinking model's reasoning before its answer (sent back with it). */
  reasoning?: string;
  /** How long the reasoning was, for the "Thinking" summary (thinking.ts). */
  thinking?: ThinkingStats;
}

export interface Conversation {
  id: string;
  title: string;
  system: string;
  temperature: number;
  turns: Turn[];
  updated: number;
  /** The chat's thinking switch, sent as `ChatRequest.enable_thinking`;
   * left out: the model's template decides (docs/thinking-and-tools.md). */
  enableThinking?: boolean;
}

/** The thinking switch's positions: the template's default, on, off. */
export type ThinkingChoice = "default" | "on" | "off";

export const HISTORY_KEY = "flashbar.conversations";
const MAX_CONVERSATIONS = 50;

export interface StoragePort {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export function turnText(turn: Turn): string {
  return turn.segments.map((s) => s.text).join("");
}

export function newConversation(now = Date.now()): Conversation {
  return {
    id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 6)}`,
    title: "New chat",
    system: "",
    temperature: 0.7,
    turns: [],
    updated: now,
  };
}

/** Saved conversations, newest first; unreadable data gives none. */
export function loadAll(storage: StoragePort): Conversation[] {
  try {
    const parsed: unknown = JSON.parse(storage.getItem(HISTORY_KEY) ?? "[]");
    return Array.isArray(parsed) ? (parsed as Conversation[]).filter((c) => c && Array.isArray(c.turns)) : [];
  } catch {
    return [];
  }
}

/** Saves `conversation` (replacing its older copy), keeping the newest. */
export function save(storage: StoragePort, conversation: Conversation): Conversation[] {
  const others = loadAll(storage).filter((c) => c.id !== conversation.id);
  const all = [conversation, ...others]
    .filter((c) => c.turns.length > 0)
    .sort((a, b) => b.updated - a.updated)
    .slice(0, MAX_CONVERSATIONS);
  storage.setItem(HISTORY_KEY, JSON.stringify(all));
  return all;
}

export function remove(storage: StoragePort, id: string): Conversation[] {
  const all = loadAll(storage).filter((c) => c.id !== id);
  storage.setItem(HISTORY_KEY, JSON.stringify(all));
  return all;
}

/** A message the model is sent; an answer carries its reasoning back,
 * which the chat template renders (docs/thinking-and-tools.md). */
export interface OutMessage {
  role: "user" | "assistant";
  content: string;
  reasoning_content?: string;
}

/** The messages the model is sent for the conversation's turns. */
export function messagesOf(conversation: Conversation): OutMessage[] {
  return conversation.turns
    .filter((t) => !(t.role === "assistant" && t.finish?.startsWith("error")))
    .map((t) => (t.reasoning ? { role: t.role, content: turnText(t), reasoning_content: t.reasoning } : { role: t.role, content: turnText(t) }));
}

/** Where the conversation's thinking switch stands (a saved value that is
 * not true or false counts as unset). */
export function thinkingChoice(conversation: Conversation): ThinkingChoice {
  const on = conversation.enableThinking;
  return on === true ? "on" : on === false ? "off" : "default";
}

/** Sets the thinking switch; "default" unsets it. */
export function setThinkingChoice(conversation: Conversation, choice: ThinkingChoice): void {
  if (choice === "default") delete conversation.enableThinking;
  else conversation.enableThinking = choice === "on";
}

/** The request's `enable_thinking`: null leaves the template's default. */
export function enableThinkingOf(conversation: Conversation): boolean | null {
  const choice = thinkingChoice(conversation);
  return choice === "default" ? null : choice === "on";
}

/** Drops the last answer so it can be asked again; false if there is none. */
export function dropLastAnswer(conversation: Conversation): boolean {
  const last = conversation.turns.at(-1);
  if (!last || last.role !== "assistant") return false;
  conversation.turns.pop();
  return true;
}

/** A title from the first question. */
export function titleFrom(text: string): string {
  const line = text.trim().split("\n")[0] ?? "";
  return line.length > 40 ? `${line.slice(0, 39)}…` : line || "New chat";
}
