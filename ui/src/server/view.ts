// The Server panel: the local server's last requests, one line each, live
// (method, path, model, status, tokens, speculation, accepted drafts, time;
// never a key or any prompt text).
import { api, errorText, type RequestLine } from "../api";
import { el } from "../dom";
import { keep, lineText } from "./lines";

export class ServerView {
  readonly root = el("section", { class: "server-log", "data-testid": "server-log" });
  private list = el("ol", { class: "lines", "data-testid": "server-lines" });
  private empty = el("p", { class: "hint", text: "No requests yet. Turn the local server on in Settings." });
  private lines: RequestLine[] = [];

  constructor() {
    this.root.append(el("h2", { text: "Server requests" }), this.empty, this.list);
  }

  /** The lines the app kept before this window opened. */
  async load(): Promise<void> {
    try {
      for (const line of await api.serverLog()) this.push(line);
    } catch (error) {
      this.empty.textContent = `The server log could not be read: ${errorText(error)}`;
    }
  }

  push(line: RequestLine): void {
    this.lines = keep(this.lines, line);
    this.empty.hidden = true;
    this.list.replaceChildren(
      ...this.lines.map((l) => el("li", { "data-status": String(l.status), text: lineText(l) })),
    );
  }
}
