// Generated from the Rust types by src-tauri/src/bindings.rs (ts-rs): do not edit.
// FLASHBAR_WRITE_BINDINGS=1 cargo test -p flashbar-app bindings writes it again.

export type Speculation = "auto" | "dflash" | "off";

export type Message = { role: string, content: string, 
/**
 * An earlier assistant turn's thinking, kept apart from its answer.
 */
reasoning_content?: string, };

export type Mode = "ar" | "dflash";

export type GateState = "calibrating" | "warmingup" | "speculating" | "floored";

export type ThermalState = "nominal" | "fair" | "serious" | "critical" | "unknown";

export type RoundStats = { mode: Mode, 
/**
 * Tokens proposed (1 for AR).
 */
block_size: number, 
/**
 * Drafted tokens the target accepted (0 for AR).
 */
accepted: number, 
/**
 * Tokens committed this round.
 */
committed: number, 
/**
 * The host's time to build and queue the draft; the device drafts
 * while the verify is built, so its time falls into `verify_ms`
 * (the drafter alone with `FLASHBAR_DRAFT_SYNC=1`).
 */
draft_ms: number, verify_ms: number, rollback_ms: number, 
/**
 * The whole round, start to end (its parts and the host work between).
 */
round_ms: number, 
/**
 * Tokens committed per second of `round_ms`: the one definition of a
 * round's speed (the metrics panel and the tray show it).
 */
tokens_per_second: number, 
/**
 * DFlash rounds: committed tokens x warm plain step time / round time
 * (None until plain decoding has been timed; always None for plain
 * rounds, which are plain decoding itself).
 */
speedup: number | null, 
/**
 * The speedup gate's state after this round (None: speculation not gated).
 */
gate: GateState | null, thermal: ThermalState, };

export type FinishReason = "stop" | "length" | "cancelled";

export type Totals = { mode: Mode | null, prompt_tokens: number, completion_tokens: number, 
/**
 * Completion tokens inside the think block (its tags included).
 */
reasoning_tokens: number, rounds: number, 
/**
 * Drafted tokens the target accepted, over all DFlash rounds.
 */
accepted_tokens: number, 
/**
 * Drafted tokens the target rejected, over all DFlash rounds.
 */
rejected_tokens: number, mean_accept_len: number, prompt_seconds: number, decode_seconds: number, tokens_per_second: number, };

export type EngineState = "idle" | "loading" | "ready" | "failed";

export type EngineStatus = { state: EngineState, target: string, drafter: string | null, model_id: string, 
/**
 * Time spent loading so far (or in total, once ready).
 */
elapsed_ms: number, error: string | null, };

export type ChatRequest = { messages: Array<Message>, system: string, temperature: number, max_tokens: number, seed: number, 
/**
 * The chat's thinking switch: passed to the chat template as its
 * `enable_thinking` keyword argument, as the server's
 * `chat_template_kwargs` pass it; None leaves the template's default
 * (docs/thinking-and-tools.md).
 */
enable_thinking: boolean | null, };

export type TokenEvent = { job: number, id: number | null, from_draft: boolean, 
/**
 * A thinking model's reasoning (docs/thinking-and-tools.md).
 */
reasoning: string, text: string, };

export type RoundEvent = { job: number, mode: Mode, 
/**
 * Tokens proposed (1 for AR).
 */
block_size: number, 
/**
 * Drafted tokens the target accepted (0 for AR).
 */
accepted: number, 
/**
 * Tokens committed this round.
 */
committed: number, 
/**
 * The host's time to build and queue the draft; the device drafts
 * while the verify is built, so its time falls into `verify_ms`
 * (the drafter alone with `FLASHBAR_DRAFT_SYNC=1`).
 */
draft_ms: number, verify_ms: number, rollback_ms: number, 
/**
 * The whole round, start to end (its parts and the host work between).
 */
round_ms: number, 
/**
 * Tokens committed per second of `round_ms`: the one definition of a
 * round's speed (the metrics panel and the tray show it).
 */
tokens_per_second: number, 
/**
 * DFlash rounds: committed tokens x warm plain step time / round time
 * (None until plain decoding has been timed; always None for plain
 * rounds, which are plain decoding itself).
 */
speedup: number | null, 
/**
 * The speedup gate's state after this round (None: speculation not gated).
 */
gate: GateState | null, thermal: ThermalState, };

export type DoneEvent = { job: number, finish_reason: FinishReason, reasoning: string, text: string, stats: Totals, };

export type ErrorEvent = { job: number, error: string, };

export type ReloadedEvent = { job: number, ms: number, };

export type Settings = { server_enabled: boolean, port: number, 
/**
 * Empty: no key required.
 */
api_key: string, 
/**
 * Target folder; empty: the default pair.
 */
target: string, 
/**
 * Drafter folder; empty: none (or the default pair's).
 */
drafter: string, speculation: Speculation, launch_at_login: boolean, 
/**
 * Live tokens/s and DFlash speedup in the tray while generating.
 */
tray_speed: boolean, 
/**
 * Minutes without a request after which the model and drafter are
 * unloaded (the next request loads them again); 0: never.
 */
idle_unload_minutes: number, };

export type ServerStatus = { running: boolean, 
/**
 * `http://127.0.0.1:PORT` while running.
 */
address: string | null, 
/**
 * Why it is not running although enabled.
 */
error: string | null, };

export type RequestLine = { method: string, path: string, model: string | null, status: number, prompt_tokens: number | null, completion_tokens: number | null, 
/**
 * The speculation mode the request asked for.
 */
speculation: Speculation | null, 
/**
 * How its tokens were made, if it generated.
 */
mode: Mode | null, accepted_drafts: number | null, ms: number, };

export type Finding = { check: string, ok: boolean, detail: string, };

export type Verdict = { target: string, drafter: string | null, 
/**
 * No check failed (one that could not be made here does not block).
 */
ok: boolean, findings: Array<Finding>, };

export type ModelInfo = { id: string, 
/**
 * `owner/name` on the hub; None for an embedded model.
 */
repo: string | null, size_bytes: number, 
/**
 * The size is an estimate (the hub gives the exact one on download).
 */
estimate: boolean, 
/**
 * Its folder, when it is on this machine.
 */
path: string | null, };

export type PairInfo = { id: string, name: string, 
/**
 * Memory the pair needs to run.
 */
memory_bytes: number, 
/**
 * Whether that fits this machine's budget (None: unknown here).
 */
fits: boolean | null, target: ModelInfo, 
/**
 * The default drafter (the catalogue's first).
 */
drafter: ModelInfo | null, 
/**
 * Both models are here: the pair can be chosen.
 */
local: boolean, 
/**
 * Shipped with the app (nothing to download or delete).
 */
embedded: boolean, };

export type LocalModel = { repo: string, size_bytes: number, 
/**
 * Bytes of an unfinished (resumable) download.
 */
incomplete_bytes: number, 
/**
 * The newest complete snapshot's folder, if any.
 */
path: string | null, };

export type LocalModels = { 
/**
 * The store's folder.
 */
store: string, 
/**
 * Bytes every repo there takes, unfinished downloads included.
 */
used_bytes: number, 
/**
 * Free space on its disk (None when it cannot be measured).
 */
free_bytes: number | null, repos: Array<LocalModel>, };

export type DownloadPhase = "starting" | "running" | "done" | "cancelled" | "failed";

export type DownloadState = { pair: string, state: DownloadPhase, 
/**
 * The file being fetched.
 */
file: string, 
/**
 * Over both models, files already on disk included.
 */
done_bytes: number, total_bytes: number, bytes_per_second: number, 
/**
 * None until a speed is known.
 */
eta_seconds: number | null, error: string | null, };
