// The Server panel's model: the local server's request lines (the app keeps
// the last KEEP, src-tauri/src/server/log.rs), newest last, each shown as the
// log file writes it (crates/flashbar-server/src/request_log.rs).
import type { RequestLine } from "../api";

export const KEEP = 200;

/** Adds a line, dropping the oldest past KEEP. */
export function keep(lines: RequestLine[], line: RequestLine): RequestLine[] {
  const next = [...lines, line];
  return next.length > KEEP ? next.slice(next.length - KEEP) : next;
}

const dash = (value: string | number | null) => (value === null ? "-" : String(value));

/** The line as the log file has it. */
export function lineText(l: RequestLine): string {
  return (
    `${l.method} ${l.path} ${l.status} model=${dash(l.model)} prompt_tokens=${dash(l.prompt_tokens)} ` +
    `completion_tokens=${dash(l.completion_tokens)} speculation=${dash(l.speculation)} ` +
    `mode=${dash(l.mode)} accepted=${dash(l.accepted_drafts)} ${l.ms} ms`
  );
}
