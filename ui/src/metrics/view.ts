// The metrics panel: live charts (Chart.js) of every decoding round —
// accept length and block size, realized speedup of DFlash rounds against
// plain decoding (the measured AR speed is 1×; plain rounds are their own
// grey points) and tok/s, and the speedup gate's and the thermal state over
// time. The headline is the time saved or lost against plain decoding.
import {
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  Tooltip,
  type ChartConfiguration,
} from "chart.js";
import type { RoundEvent } from "../api";
import { el } from "../dom";
import { addRound, emptySeries, savedText, summarize, type Series } from "./series";

Chart.register(CategoryScale, LinearScale, LineController, LineElement, PointElement, Legend, Tooltip);

const GATE_STATES = ["off", "floored", "calibrating", "warmingup", "speculating", "ungated"];
const THERMAL_STATES = ["unknown", "nominal", "fair", "serious", "critical"];

function palette(): { text: string; grid: string } {
  const dark = window.matchMedia?.("(prefers-color-scheme: dark)").matches;
  return dark ? { text: "#d4d4d8", grid: "rgba(255,255,255,0.12)" } : { text: "#3f3f46", grid: "rgba(0,0,0,0.08)" };
}

export class MetricsView {
  readonly root = el("section", { class: "metrics", "data-testid": "metrics" });
  private series: Series = emptySeries();
  private charts: Chart[] = [];
  private headline = el("p", { class: "headline", "data-testid": "metrics-saved" });
  private summary = el("p", { class: "summary", "data-testid": "metrics-summary" });
  private dirty = false;

  constructor() {
    const clear = el("button", { text: "Clear" });
    clear.addEventListener("click", () => {
      this.series = emptySeries();
      this.refresh();
    });
    this.root.append(el("div", { class: "bar" }, el("div", {}, this.headline, this.summary), clear));
    const { text, grid } = palette();
    Chart.defaults.color = text;
    Chart.defaults.borderColor = grid;
    const common = { animation: false as const, responsive: true, maintainAspectRatio: false, interaction: { mode: "index" as const, intersect: false } };
    this.add("accept-chart", "Accept length per round", {
      type: "line",
      data: {
        labels: [],
        datasets: [
          { label: "committed tokens", data: [], borderColor: "#d97706", backgroundColor: "#d97706", pointRadius: 2 },
          { label: "block size", data: [], borderColor: "#6366f1", backgroundColor: "#6366f1", stepped: true, borderDash: [4, 3], pointRadius: 0 },
        ],
      },
      options: { ...common, scales: { y: { beginAtZero: true, title: { display: true, text: "tokens" } } } },
    });
    this.add("speed-chart", "Realized speedup vs plain decoding, and tok/s", {
      type: "line",
      data: {
        labels: [],
        datasets: [
          { label: "DFlash round speedup (×)", data: [], borderColor: "#16a34a", backgroundColor: "#16a34a", yAxisID: "y", pointRadius: 2, spanGaps: true },
          { label: "plain decoding rounds", data: [], borderColor: "#71717a", backgroundColor: "#71717a", yAxisID: "y", pointRadius: 3, pointStyle: "rectRot", showLine: false },
          { label: "plain decoding (measured AR) = 1×", data: [], borderColor: "#a1a1aa", borderDash: [2, 2], yAxisID: "y", pointRadius: 0 },
          { label: "tok/s", data: [], borderColor: "#0ea5e9", backgroundColor: "#0ea5e9", yAxisID: "tps", pointRadius: 1 },
        ],
      },
      options: {
        ...common,
        scales: {
          y: { beginAtZero: true, title: { display: true, text: "speedup ×" } },
          tps: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "tok/s" } },
        },
      },
    });
    this.add("state-chart", "Speedup gate and thermal state", {
      type: "line",
      data: {
        labels: [],
        datasets: [
          { label: "gate", data: [], borderColor: "#d97706", stepped: true, pointRadius: 0, yAxisID: "gate" },
          { label: "thermal", data: [], borderColor: "#dc2626", stepped: true, pointRadius: 0, yAxisID: "thermal" },
        ],
      },
      options: {
        ...common,
        scales: {
          gate: { type: "category", labels: [...GATE_STATES].reverse(), position: "left" },
          thermal: { type: "category", labels: [...THERMAL_STATES].reverse(), position: "right", grid: { drawOnChartArea: false } },
        },
      },
    });
    this.refresh();
  }

  private add(testid: string, title: string, config: ChartConfiguration<"line", (number | string | null)[], number>): void {
    const canvas = el("canvas", { "data-testid": testid, "aria-label": title, role: "img" });
    this.root.append(el("figure", {}, el("figcaption", { text: title }), el("div", { class: "chart-box" }, canvas)));
    this.charts.push(new Chart(canvas, config as ChartConfiguration));
  }

  /** A round from the engine; charts redraw at most once a frame. */
  push(round: RoundEvent): void {
    addRound(this.series, round);
    if (this.dirty) return;
    this.dirty = true;
    requestAnimationFrame(() => {
      this.dirty = false;
      this.refresh();
    });
  }

  /** Charts must be resized once their tab becomes visible. */
  shown(): void {
    // After layout: a chart created or updated while hidden has no size.
    requestAnimationFrame(() => {
      for (const chart of this.charts) {
        chart.resize();
        chart.update();
      }
    });
  }

  private refresh(): void {
    const s = this.series;
    const [accept, speed, state] = this.charts;
    accept.data.labels = s.rounds;
    accept.data.datasets[0].data = s.acceptLength;
    accept.data.datasets[1].data = s.blockSize;
    speed.data.labels = s.rounds;
    speed.data.datasets[0].data = s.speedup;
    speed.data.datasets[1].data = s.plain;
    speed.data.datasets[2].data = s.rounds.map(() => 1);
    speed.data.datasets[3].data = s.tokensPerSecond;
    state.data.labels = s.rounds;
    state.data.datasets[0].data = s.gate as unknown as number[];
    state.data.datasets[1].data = s.thermal as unknown as number[];
    for (const chart of this.charts) {
      chart.update();
      // What the chart drew, for tests and assistive tech.
      chart.canvas.dataset.points = String(chart.data.datasets[0].data.length);
    }
    const sum = summarize(s);
    this.headline.textContent = sum.rounds ? savedText(sum.saved) : "";
    this.summary.textContent = sum.rounds
      ? `${sum.rounds} rounds (${sum.plainRounds} plain) · mean accept ${sum.meanAccept.toFixed(2)} · gate ${sum.lastGate} · thermal ${sum.lastThermal}`
      : "No rounds yet: chat with the model and watch them arrive.";
  }
}
