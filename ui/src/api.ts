// The one place the UI talks to the app shell (src-tauri): typed commands
// and events. Views import from here, never from @tauri-apps/api directly.
import { invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";

// The payloads of the commands and events are generated from the Rust
// types (bindings.ts; src-tauri/src/bindings.rs checks they match).
import type {
  ChatRequest,
  DoneEvent,
  DownloadState,
  EngineStatus,
  ErrorEvent,
  LocalModels,
  PairInfo,
  ReloadedEvent,
  RequestLine,
  RoundEvent,
  ServerStatus,
  Settings,
  TokenEvent,
  Verdict,
} from "./bindings";

export type * from "./bindings";

export type View = "chat" | "models" | "metrics" | "server" | "settings";

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
