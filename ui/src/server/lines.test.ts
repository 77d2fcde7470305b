import { describe, expect, it } from "vitest";
import type { RequestLine } from "../api";
import { keep, KEEP, lineText } from "./lines";

function line(over: Partial<RequestLine>): RequestLine {
  return {
    method: "POST", path: "/v1/chat/completions", model: "flashbar-default", status: 200,
    prompt_tokens: 12, completion_tokens: 40, speculation: "auto", mode: "dflash",
    accepted_drafts: 31, ms: 812, ...over,
  };
}

describe("server lines", () => {
  it("read as the log file's lines", () => {
    // The same line as request_log.rs's a_line_names_what_was_asked_and_made.
    expect(lineText(line({}))).toBe(
      "POST /v1/chat/completions 200 model=flashbar-default prompt_tokens=12 " +
        "completion_tokens=40 speculation=auto mode=dflash accepted=31 812 ms",
    );
    const refused = line({ status: 401, model: null, prompt_tokens: null, completion_tokens: null,
      speculation: null, mode: null, accepted_drafts: null, ms: 0 });
    expect(lineText(refused)).toBe(
      "POST /v1/chat/completions 401 model=- prompt_tokens=- completion_tokens=- speculation=- mode=- accepted=- 0 ms",
    );
  });

  it("keep the newest KEEP", () => {
    let lines: RequestLine[] = [];
    for (let n = 0; n < KEEP + 5; n++) lines = keep(lines, line({ ms: n }));
    expect(lines).toHaveLength(KEEP);
    expect(lines[0].ms).toBe(5);
    expect(lines[KEEP - 1].ms).toBe(KEEP + 4);
  });
});
