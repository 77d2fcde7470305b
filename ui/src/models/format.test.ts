import { describe, expect, it } from "vitest";
import { formatBytes, formatEta, formatSpeed, percent } from "./format";

describe("sizes, speeds and times left", () => {
  it("writes bytes in decimal units", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(999)).toBe("999 B");
    expect(formatBytes(1000)).toBe("1.0 kB");
    expect(formatBytes(14_714_203)).toBe("15 MB");
    expect(formatBytes(4_805_000_000)).toBe("4.8 GB");
    expect(formatBytes(2e15)).toBe("2000 TB");
    expect(formatBytes(-1)).toBe("–");
    expect(formatBytes(Number.NaN)).toBe("–");
  });

  it("writes a speed only once one is known", () => {
    expect(formatSpeed(3_400_000)).toBe("3.4 MB/s");
    expect(formatSpeed(0)).toBe("–");
  });

  it("writes the time left in seconds, minutes or hours", () => {
    expect(formatEta(null)).toBe("–");
    expect(formatEta(Number.POSITIVE_INFINITY)).toBe("–");
    expect(formatEta(0.2)).toBe("1 s");
    expect(formatEta(59)).toBe("59 s");
    expect(formatEta(185)).toBe("3 min 05 s");
    expect(formatEta(2 * 3600 + 7 * 60 + 30)).toBe("2 h 07 min");
  });

  it("bounds the bar's share", () => {
    expect(percent(50, 200)).toBe(25);
    expect(percent(5, 0)).toBe(0);
    expect(percent(300, 200)).toBe(100);
  });
});
