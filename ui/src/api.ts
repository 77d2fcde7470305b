// The one place the UI talks to the app shell (src-tauri): typed commands
// and events. Views import from here, never from @tauri-apps/api directly.
import { invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";

export type Speculation = "auto" | "dflash" | "off";

export interface Message {
  role: "user" | "assistant" | "system";
  content: string;
}

export interface EngineStatus {
  state: "idle" | "loading" | "ready" | "failed";
  target: string;
  drafter: string | null;
  model_id: string;
  elapsed_ms: number;
  error: string | null;
}

export interface ChatRequest {
  messages: Message[];
  system: string;
  temperature: number;
  max_tokens: number;
  seed: number;
}

/** Text released after a token; `from_draft` when a draft proposed it. */
export interface TokenEvent {
  job: number;
  id: number | null;
  from_draft: boolean;
  text: string;
}

/** One decoding round (the engine's RoundStats). */
export interface RoundEvent {
  job: number;
  mode: "ar" | "dflash";
  block_size: number;
  accepted: number;
  committed: number;
  draft_ms: number;
  verify_ms: number;
  rollback_ms: number;
  /** The whole round (its parts and the host work between). */
  round_ms: number;
  speedup: number | null;
  gate: string | null;
  thermal: string;
  tokens_per_second: number;
}

export interface Totals {
  completion_tokens: number;
  accepted_tokens: number;
  rounds: number;
  mean_accept_len: number;
  tokens_per_second: number;
}

export interface DoneEvent {
  job: number;
  finish_reason: "stop" | "length" | "cancelled";
  text: string;
  stats: Totals;
}

export interface ErrorEvent {
  job: number;
  error: string;
}

export interface Settings {
  server_enabled: boolean;
  port: number;
  api_key: string;
  target: string;
  drafter: string;
  speculation: Speculation;
  launch_at_login: boolean;
  tray_speed: boolean;
  /** Minutes without a request before the pair is unloaded; 0: never. */
  idle_unload_minutes: number;
}

/** The pair had been unloaded while idle and was loaded again for `job`. */
export interface ReloadedEvent {
  job: number;
  ms: number;
}

export interface ServerStatus {
  running: boolean;
  address: string | null;
  error: string | null;
}

export interface Verdict {
  target: string;
  drafter: string | null;
  ok: boolean;
  findings: { check: string; ok: boolean; detail: string }[];
}

export interface ModelInfo {
  id: string;
  /** owner/name on the hub; null for an embedded model. */
  repo: string | null;
  size_bytes: number;
  estimate: boolean;
  /** Its folder, when it is on this machine. */
  path: string | null;
}

/** A catalogue pair, with what is on this machine. */
export interface PairInfo {
  id: string;
  name: string;
  memory_bytes: number;
  fits: boolean | null;
  target: ModelInfo;
  drafter: ModelInfo | null;
  local: boolean;
  embedded: boolean;
}

export interface LocalModels {
  store: string;
  used_bytes: number;
  free_bytes: number | null;
  repos: { repo: string; size_bytes: number; incomplete_bytes: number; path: string | null }[];
}

/** A pair's download (the `models:download` event). */
export interface DownloadState {
  pair: string;
  state: "starting" | "running" | "done" | "cancelled" | "failed";
  file: string;
  done_bytes: number;
  total_bytes: number;
  bytes_per_second: number;
  eta_seconds: number | null;
  error: string | null;
}

export type View = "chat" | "models" | "metrics" | "server" | "settings";

/** One local-server request, as the log has it (flashbar-server's RequestLine). */
export interface RequestLine {
  method: string;
  path: string;
  model: string | null;
  status: number;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  speculation: "auto" | "off" | "dflash" | null;
  mode: "ar" | "dflash" | null;
  accepted_drafts: number | null;
  ms: number;
}

export const api = {
  engineStatus: () => invoke<EngineStatus>("engine_status"),
  chatSend: (request: ChatRequest) => invoke<number>("chat_send", { request }),
  chatStop: (job: number) => invoke<boolean>("chat_stop", { job }),
  settingsGet: () => invoke<Settings>("settings_get"),
  settingsSet: (settings: Settings) => invoke<Settings>("settings_set", { settings }),
  serverStatus: () => invoke<ServerStatus>("server_status"),
  serverLog: () => invoke<RequestLine[]>("server_log"),
  uiReady: () => invoke<void>("ui_ready"),
  logsFolder: () => invoke<string>("logs_folder"),
  logsOpen: () => invoke<void>("logs_open"),
  modelsCheck: (target: string, drafter: string) => invoke<Verdict>("models_check", { target, drafter }),
  modelsPairCheck: (pair: string) => invoke<Verdict>("models_pair_check", { pair }),
  modelsCatalogue: () => invoke<PairInfo[]>("models_catalogue"),
  modelsLocal: () => invoke<LocalModels>("models_local"),
  modelsDelete: (repo: string) => invoke<number>("models_delete", { repo }),
  modelsDownloads: () => invoke<DownloadState[]>("models_downloads"),
  modelsDownload: (pair: string) => invoke<void>("models_download", { pair }),
  modelsCancel: (pair: string) => invoke<boolean>("models_cancel", { pair }),
  /** The saved conversations: a JSON array as text ("[]" when none). */
  historyLoad: () => invoke<string>("history_load"),
  /** Replaces the saved conversations (crash-safe: atomic write + rename). */
  historySave: (json: string) => invoke<void>("history_save", { json }),
};

function on<T>(name: string) {
  return (handler: (payload: T) => void): Promise<UnlistenFn> =>
    listen<T>(name, (event) => handler(event.payload));
}

export const events = {
  engineStatus: on<EngineStatus>("engine:status"),
  token: on<TokenEvent>("chat:token"),
  round: on<RoundEvent>("chat:round"),
  reloaded: on<ReloadedEvent>("chat:reloaded"),
  done: on<DoneEvent>("chat:done"),
  error: on<ErrorEvent>("chat:error"),
  serverStatus: on<ServerStatus>("server:status"),
  serverRequest: on<RequestLine>("server:request"),
  settingsChanged: on<Settings>("settings:changed"),
  navigate: on<View>("navigate"),
  download: on<DownloadState>("models:download"),
};

/** A command's error as one line of text. */
export function errorText(error: unknown): string {
  return typeof error === "string" ? error : error instanceof Error ? error.message : String(error);
}
