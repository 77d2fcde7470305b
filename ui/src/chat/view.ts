// The chat view: conversation history, system prompt and temperature, a
// streaming answer (markdown, highlighted code, drafted text coloured),
// stop and regenerate. A thinking model's reasoning shows in a collapsed
// "Thinking" section above its answer, and is kept with the answer; a
// per-chat switch by the composer asks the model to think or not
// (docs/thinking-and-tools.md).
import { api, errorText, type DoneEvent, type ErrorEvent, type ReloadedEvent, type TokenEvent } from "../api";
import { el } from "../dom";
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
  turnText,
  type Conversation,
  type StoragePort,
  type ThinkingChoice,
  type Turn,
} from "./history";
import { renderAnswer } from "./markdown";
import { settled, showThinking, thinkingClock, thinkingSection, tick } from "./thinking";

type JobEvent =
  | { kind: "token"; e: TokenEvent }
  | { kind: "reloaded"; e: ReloadedEvent }
  | { kind: "done"; e: DoneEvent }
  | { kind: "error"; e: ErrorEvent };

/** The note for a pair loaded again after an idle unload. */
export function reloadedNote(ms: number): string {
  return `model reloaded in ${(ms / 1000).toFixed(1)} s (it was unloaded while idle)`;
}

export class ChatView {
  readonly root = el("section", { class: "chat", "data-testid": "chat" });
  private conversation: Conversation;
  private list = el("div", { class: "turns", "data-testid": "turns" });
  private input = el("textarea", { rows: "2", placeholder: "Ask anything…", "data-testid": "chat-input" });
  private send = el("button", { class: "primary", "data-testid": "send", text: "Send" });
  private regenerate = el("button", { "data-testid": "regenerate", text: "Regenerate" });
  private picker = el("select", { "data-testid": "history", "aria-label": "Conversations" });
  private system = el("textarea", { rows: "2", placeholder: "System prompt (optional)", "data-testid": "system" });
  private temperature = el("input", { type: "range", min: "0", max: "2", step: "0.1", "data-testid": "temperature" });
  private temperatureLabel = el("span");
  /** The chat's thinking switch: the template's default, on or off. */
  private thinking = el(
    "select",
    {
      class: "thinking-switch",
      "data-testid": "thinking-switch",
      "aria-label": "Thinking",
      title: "Ask the model to think before it answers, or not (default: as its chat template says)",
    },
    el("option", { value: "default", text: "Thinking: model default" }),
    el("option", { value: "on", text: "Thinking: on" }),
    el("option", { value: "off", text: "Thinking: off" }),
  );
  private problem = el("p", { class: "error", role: "alert", "data-testid": "history-problem", hidden: "" });
  private job: number | null = null;
  /** Events that came before `chat_send` answered with the job id, and
   * when they came. */
  private early: { event: JobEvent; at: number }[] = [];
  /** Times the current answer's thinking (its "Thinking" summary). */
  private clock = thinkingClock();
  /** The current job's reload note, if the pair was loaded again for it. */
  private reloaded: string | null = null;
  private sending = false;
  private answerNode: HTMLElement | null = null;
  private thinkingNode: HTMLDetailsElement | null = null;
  private renderQueued = false;

  /** `storage`: where conversations are kept (saved.ts: the history file). */
  constructor(private storage: StoragePort) {
    this.conversation = loadAll(storage)[0] ?? newConversation();
    const newChat = el("button", { "data-testid": "new-chat", text: "New chat" });
    const deleteChat = el("button", { title: "Delete this conversation", text: "Delete", "data-testid": "delete-chat" });
    newChat.addEventListener("click", () => this.open(newConversation()));
    deleteChat.addEventListener("click", () => {
      remove(this.storage, this.conversation.id);
      this.open(loadAll(this.storage)[0] ?? newConversation());
    });
    this.picker.addEventListener("change", () => {
      const found = loadAll(this.storage).find((c) => c.id === this.picker.value);
      if (found) this.open(found);
    });
    const options = el(
      "details",
      { class: "options" },
      el("summary", { text: "System prompt & temperature" }),
      this.system,
      el("label", {}, "Temperature ", this.temperature, " ", this.temperatureLabel),
    );
    this.system.addEventListener("change", () => {
      this.conversation.system = this.system.value;
      this.persist();
    });
    this.temperature.addEventListener("input", () => {
      this.conversation.temperature = Number(this.temperature.value);
      this.temperatureLabel.textContent = this.temperature.value;
      this.persist();
    });
    this.thinking.addEventListener("change", () => {
      setThinkingChoice(this.conversation, this.thinking.value as ThinkingChoice);
      this.persist();
    });
    this.send.addEventListener("click", () => (this.job === null && !this.sending ? this.ask() : this.stop()));
    this.regenerate.addEventListener("click", () => this.redo());
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        if (this.job === null && !this.sending) void this.ask();
      }
    });
    const bar = el("div", { class: "bar" }, this.picker, newChat, deleteChat);
    const composer = el("div", { class: "composer" }, this.input, el("div", { class: "actions" }, this.thinking, this.regenerate, this.send));
    this.root.append(bar, this.problem, options, this.list, composer);
    this.open(this.conversation);
  }

  /** Shows a problem saving the history (null: none any more). */
  showHistoryProblem(problem: string | null): void {
    this.problem.textContent = problem ?? "";
    this.problem.hidden = problem === null;
  }

  /** Routes a streamed event to the answer being written; `at`: when it
   * came (performance.now()). */
  handle(event: JobEvent, at = performance.now()): void {
    if (this.sending && this.job === null) {
      this.early.push({ event, at });
      return;
    }
    if (event.e.job !== this.job) return;
    const answer = this.conversation.turns.at(-1);
    if (!answer || answer.role !== "assistant") return;
    if (event.kind === "reloaded") {
      this.reloaded = reloadedNote(event.e.ms);
      return;
    }
    if (event.kind === "token") {
      this.clock = tick(this.clock, event.e, at);
      if (this.clock.stats) answer.thinking = this.clock.stats;
      if (event.e.reasoning) {
        answer.reasoning = (answer.reasoning ?? "") + event.e.reasoning;
        this.queueRender();
      }
      if (!event.e.text) return;
      const last = answer.segments.at(-1);
      if (last && last.fromDraft === event.e.from_draft) last.text += event.e.text;
      else answer.segments.push({ text: event.e.text, fromDraft: event.e.from_draft });
      this.queueRender();
      return;
    }
    if (event.kind === "done") {
      if (event.e.reasoning) answer.reasoning = event.e.reasoning;
      const s = event.e.stats;
      answer.thinking = settled(answer.thinking, s.reasoning_tokens);
      const drafted = s.completion_tokens ? Math.round((100 * s.accepted_tokens) / s.completion_tokens) : 0;
      answer.finish = `${event.e.finish_reason} · ${s.completion_tokens} tokens · ${s.tokens_per_second.toFixed(1)} tok/s · ${drafted}% from drafts`;
      if (s.reasoning_tokens) answer.finish += ` · ${s.reasoning_tokens} thinking`;
    } else {
      answer.finish = `error: ${event.e.error}`;
    }
    if (this.reloaded) answer.finish += ` · ${this.reloaded}`;
    this.reloaded = null;
    this.job = null;
    this.persist();
    this.renderTurns();
    this.setBusy(false);
  }

  private async ask(): Promise<void> {
    const text = this.input.value.trim();
    if (!text) return;
    this.input.value = "";
    if (this.conversation.turns.length === 0) this.conversation.title = titleFrom(text);
    this.conversation.turns.push({ role: "user", segments: [{ text, fromDraft: false }] });
    await this.start();
  }

  private async redo(): Promise<void> {
    if (this.job !== null || this.sending) return;
    if (!dropLastAnswer(this.conversation) || this.conversation.turns.length === 0) return;
    await this.start();
  }

  private async start(): Promise<void> {
    const messages = messagesOf(this.conversation);
    this.conversation.turns.push({ role: "assistant", segments: [] });
    this.renderTurns();
    this.setBusy(true);
    this.sending = true;
    this.early = [];
    this.reloaded = null;
    this.clock = thinkingClock();
    try {
      this.job = await api.chatSend({
        messages,
        system: this.conversation.system,
        temperature: this.conversation.temperature,
        max_tokens: 256,
        seed: Math.floor(Math.random() * 2 ** 31),
        enable_thinking: enableThinkingOf(this.conversation),
      });
      this.sending = false;
      const early = this.early;
      this.early = [];
      for (const { event, at } of early) this.handle(event, at);
    } catch (error) {
      this.sending = false;
      const answer = this.conversation.turns.at(-1) as Turn;
      answer.finish = `error: ${errorText(error)}`;
      this.renderTurns();
      this.setBusy(false);
    }
    this.persist();
  }

  private stop(): void {
    if (this.job !== null) void api.chatStop(this.job);
  }

  private open(conversation: Conversation): void {
    this.conversation = conversation;
    this.job = null;
    this.system.value = conversation.system;
    this.temperature.value = String(conversation.temperature);
    this.temperatureLabel.textContent = String(conversation.temperature);
    this.thinking.value = thinkingChoice(conversation);
    this.refreshPicker();
    this.renderTurns();
    this.setBusy(false);
  }

  private persist(): void {
    this.conversation.updated = Date.now();
    save(this.storage, this.conversation);
    this.refreshPicker();
  }

  private refreshPicker(): void {
    const all = loadAll(this.storage);
    if (!all.some((c) => c.id === this.conversation.id)) all.unshift(this.conversation);
    this.picker.replaceChildren(...all.map((c) => el("option", { value: c.id, text: c.title })));
    this.picker.value = this.conversation.id;
  }

  private setBusy(busy: boolean): void {
    this.send.textContent = busy ? "Stop" : "Send";
    this.send.classList.toggle("stop", busy);
    this.send.dataset.testid = busy ? "stop" : "send";
    this.regenerate.disabled = busy || this.conversation.turns.at(-1)?.role !== "assistant";
  }

  private queueRender(): void {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      const answer = this.conversation.turns.at(-1);
      if (this.answerNode && answer) renderAnswer(this.answerNode, answer.segments);
      if (this.thinkingNode && answer) showThinking(this.thinkingNode, answer.reasoning, answer.thinking);
      this.list.scrollTop = this.list.scrollHeight;
    });
  }

  private renderTurns(): void {
    this.list.replaceChildren();
    this.thinkingNode = null;
    if (this.conversation.turns.length === 0) {
      this.list.append(el("p", { class: "empty", text: "Ask something to start. Text from accepted drafts is tinted." }));
    }
    for (const turn of this.conversation.turns) {
      const body = el("div", { class: "body" });
      if (turn.role === "user") body.textContent = turnText(turn);
      else renderAnswer(body, turn.segments);
      const node = el("article", { class: `turn ${turn.role}`, "data-testid": `turn-${turn.role}` });
      if (turn.role === "assistant") {
        this.thinkingNode = thinkingSection();
        showThinking(this.thinkingNode, turn.reasoning, turn.thinking);
        node.append(this.thinkingNode);
      }
      node.append(body);
      if (turn.finish) node.append(el("footer", { class: turn.finish.startsWith("error") ? "error" : "", text: turn.finish }));
      this.list.append(node);
      this.answerNode = body;
    }
    this.list.scrollTop = this.list.scrollHeight;
  }
}
