// How the Models view writes sizes, speeds and times left: short, in
// decimal units as disks and the hub count them.

const UNITS = ["B", "kB", "MB", "GB", "TB"];

/** 1234567 → "1.2 MB"; below 10 of a unit one decimal, else none. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return "–";
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit += 1;
  }
  if (unit === 0) return `${Math.round(value)} B`;
  const text = value < 10 ? value.toFixed(1) : Math.round(value).toString();
  return `${text} ${UNITS[unit]}`;
}

/** Bytes per second as "3.4 MB/s" (nothing known yet: "–"). */
export function formatSpeed(bytesPerSecond: number): string {
  return bytesPerSecond > 0 ? `${formatBytes(bytesPerSecond)}/s` : "–";
}

/** Seconds left as "45 s", "3 min 05 s", "2 h 07 min"; unknown: "–". */
export function formatEta(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.ceil(seconds);
  if (s < 60) return `${s} s`;
  const minutes = Math.floor(s / 60);
  if (minutes < 60) return `${minutes} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

/** Share done, 0–100, for a progress bar (an empty total is 0). */
export function percent(done: number, total: number): number {
  if (total <= 0) return 0;
  return Math.min(100, Math.max(0, (done / total) * 100));
}
