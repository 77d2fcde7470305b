// What a catalogue row shows and allows, from the pair (is it here?) and
// its last download event: the state machine behind the Models view's
// buttons. remote → starting → running → done (local) | cancelled | failed;
// cancelled and failed resume (the hub keeps the partial files).
import type { DownloadState, PairInfo } from "../api";

export type RowState = "embedded" | "local" | "remote" | "starting" | "running" | "cancelled" | "failed";

export interface Actions {
  download: boolean;
  cancel: boolean;
  resume: boolean;
  delete: boolean;
  choose: boolean;
}

export function rowState(pair: PairInfo, download?: DownloadState): RowState {
  switch (download?.state) {
    case "starting":
    case "running":
    case "cancelled":
    case "failed":
      return download.state;
    default:
      if (!pair.local) return "remote";
      return pair.embedded ? "embedded" : "local";
  }
}

export function actions(state: RowState): Actions {
  const none: Actions = { download: false, cancel: false, resume: false, delete: false, choose: false };
  switch (state) {
    case "remote":
      return { ...none, download: true };
    case "starting":
    case "running":
      return { ...none, cancel: true };
    case "cancelled":
    case "failed":
      return { ...none, resume: true, delete: true };
    case "local":
      return { ...none, delete: true, choose: true };
    case "embedded":
      return { ...none, choose: true };
  }
}

/** Keeps each pair's latest event; a finished download replaces the
 *  running one, and a new start replaces an old end. */
export function track(downloads: Map<string, DownloadState>, event: DownloadState): Map<string, DownloadState> {
  const next = new Map(downloads);
  next.set(event.pair, event);
  return next;
}

/** The repos (owner/name) of a pair that live on the hub. */
export function repos(pair: PairInfo): string[] {
  return [pair.target.repo, pair.drafter?.repo].filter((r): r is string => !!r);
}
