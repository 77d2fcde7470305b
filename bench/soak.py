"""Soak test of `flashbar serve`: many mixed requests against one server,
watching its memory, errors and latency. Run by hand (not in CI):

    cargo build --release -p flashbar-cli
    python3 bench/soak.py --flashbar target/release/flashbar --requests 2000

It starts the server on the embedded default pair (or --model/--drafter) on
a free loopback port, sends REQUESTS requests from --clients threads, a
seeded mix of: plain chat, streamed chat read to the end, streamed chat
cancelled mid-stream (socket closed), long prompts, text completions, and bad
requests (malformed JSON, out-of-range values, unknown model, empty
messages). Only the bad requests may fail, each with its intended 4xx.

Every --sample-every seconds it records the server's RSS (/proc/PID/status)
and MLX's active memory (GET /health). After the warm-up (the first
--warmup fraction of requests) the growth of RSS and of MLX active memory,
last quarter of the samples against the first quarter, must stay under
--max-growth percent: medians for RSS, the floor (minimum) for MLX active
memory, which during a request depends on that request. Reports p50/p99 latency per kind and the queue
wait (the server's x-flashbar-queue-wait-ms header). Writes the whole result
as JSON with --json-out; exit status 1 when a check fails.
Loopback only; the run is bounded by --requests and --max-seconds.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("def fib return class import print the quick brown fox jumps over lazy dog "
         "café 日本語 emoji 🎉 speculative decoding token block draft verify").split()

# kind -> weight in the mix
MIX = {
    "chat": 30,
    "stream": 22,
    "cancel": 12,
    "long": 8,
    "completion": 14,
    "bad": 14,
}
# Each bad request and the status it must get.
BAD = [
    (b"{not json", 400),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": 9}).encode(), 400),
    (json.dumps({"messages": []}).encode(), 400),
    (json.dumps({"model": "gpt-nope", "messages": [{"role": "user", "content": "x"}]}).encode(), 404),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 3}).encode(), 400),
]


def text(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build(kind, rng):
    """(path, body bytes, expected status, streamed, cancel after N chunks)."""
    if kind == "bad":
        body, status = rng.choice(BAD)
        return "/v1/chat/completions", body, status, False, None
    if kind == "completion":
        body = {"prompt": text(rng, rng.randint(2, 40)), "max_tokens": rng.randint(1, 24),
                "temperature": rng.choice([0, 0.7])}
        return "/v1/completions", json.dumps(body).encode(), 200, False, None
    words = rng.randint(600, 900) if kind == "long" else rng.randint(1, 30)
    body = {
        "messages": [{"role": "user", "content": text(rng, words)}],
        "max_tokens": rng.randint(1, 32) if kind != "cancel" else 64,
        "temperature": rng.choice([0, 0.8]),
        "seed": rng.randint(0, 1 << 30),
        "speculation": rng.choice(["auto", "dflash", "off"]),
    }
    streamed = kind in ("stream", "cancel")
    if streamed:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    cancel_after = rng.randint(1, 4) if kind == "cancel" else None
    return "/v1/chat/completions", json.dumps(body).encode(), 200, streamed, cancel_after


def send(port, path, body, streamed, cancel_after, timeout):
    """(status, queue wait ms or None, ok-to-the-end, detail)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        response = conn.getresponse()
        wait = response.getheader("x-flashbar-queue-wait-ms")
        wait = int(wait) if wait is not None else None
        if not streamed or response.status != 200:
            data = response.read()
            if response.status == 200:
                json.loads(data)
            elif not json.loads(data).get("error"):
                return response.status, wait, False, "error without an error object"
            return response.status, wait, True, ""
        chunks, done = 0, False
        while True:
            line = response.fp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                json.loads(line[6:])
                chunks += 1
                if cancel_after is not None and chunks >= cancel_after:
                    # Client goes away mid-stream: the server must cancel.
                    conn.sock.shutdown(socket.SHUT_RDWR)
                    return response.status, wait, True, "cancelled"
        if cancel_after is not None:
            return response.status, wait, True, "finished before the cancel"
        return response.status, wait, done, "" if done else "stream ended without [DONE]"
    finally:
        conn.close()


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def health(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def growth(samples, key, pick=statistics.median):
    """Percent growth, `pick` (median; min = the idle floor) of the last
    quarter of the samples vs the first quarter."""
    values = [s[key] for s in samples if s.get(key) is not None]
    if len(values) < 4:
        return None
    q = max(1, len(values) // 4)
    first, last = pick(values[:q]), pick(values[-q:])
    return 100.0 * (last - first) / first if first else None


def start_server(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [args.flashbar, "serve", "--port", str(port), "--queue", str(args.queue)]
    if args.model:
        cmd += ["--model", args.model]
    if args.drafter:
        cmd += ["--drafter", args.drafter]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    if not re.match(r"listening on http://", line):
        server.kill()
        sys.exit(f"the server did not start: {line.strip()} {server.stderr.read().strip()}")
    return server, port


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flashbar", default=str(ROOT / "target/release/flashbar"))
    p.add_argument("--model")
    p.add_argument("--drafter")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--queue", type=int, default=64)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--sample-every", type=float, default=2.0)
    p.add_argument("--max-growth", type=float, default=5.0)
    p.add_argument("--max-seconds", type=float, default=3600)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--json-out")
    args = p.parse_args()

    server, port = start_server(args)
    pid = server.pid
    rng = random.Random(args.seed)
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=args.requests)
    plan = [(kind, build(kind, rng)) for kind in kinds]
    lock = threading.Lock()
    next_index = [0]
    results = []
    samples = []
    started = time.monotonic()
    deadline = started + args.max_seconds
    warm_index = int(args.requests * args.warmup)
    warm = threading.Event()

    def client():
        while True:
            with lock:
                i = next_index[0]
                if i >= len(plan) or time.monotonic() > deadline:
                    return
                next_index[0] += 1
            if i >= warm_index:
                warm.set()
            kind, (path, body, expected, streamed, cancel_after) = plan[i]
            t0 = time.monotonic()
            try:
                status, wait, ok, detail = send(port, path, body, streamed, cancel_after,
                                                args.timeout)
            except Exception as error:  # a failure to record, not to stop on
                status, wait, ok, detail = None, None, False, f"{type(error).__name__}: {error}"
            elapsed = time.monotonic() - t0
            with lock:
                results.append({"i": i, "kind": kind, "status": status, "expected": expected,
                                 "ok": ok and status == expected, "detail": detail,
                                 "seconds": elapsed, "queue_wait_ms": wait})

    def sampler():
        while any(t.is_alive() for t in threads):
            try:
                h = health(port)
                memory = h.get("memory", {})
                samples.append({"t": time.monotonic() - started, "done": len(results),
                                "warm": warm.is_set(), "rss": rss_bytes(pid),
                                "mlx_active": memory.get("active_bytes"),
                                "mlx_peak": memory.get("peak_bytes"),
                                "mlx_cache": memory.get("cache_bytes")})
            except Exception as error:
                samples.append({"t": time.monotonic() - started, "error": str(error)})
            time.sleep(args.sample_every)

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    watcher = threading.Thread(target=sampler)
    watcher.start()
    for t in threads:
        t.join()
    watcher.join()
    wall = time.monotonic() - started
    alive = server.poll() is None
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()

    failures = [r for r in results if not r["ok"]]
    by_kind = {}
    for kind in MIX:
        rs = [r for r in results if r["kind"] == kind]
        secs = [r["seconds"] for r in rs]
        by_kind[kind] = {"n": len(rs), "failed": sum(not r["ok"] for r in rs),
                         "p50_ms": round(1000 * percentile(secs, 0.5), 1) if secs else None,
                         "p99_ms": round(1000 * percentile(secs, 0.99), 1) if secs else None}
    waits = [r["queue_wait_ms"] for r in results if r["queue_wait_ms"] is not None]
    warm_samples = [s for s in samples if s.get("warm") and "error" not in s]
    summary = {
        "requests_planned": args.requests,
        "requests_done": len(results),
        "clients": args.clients,
        "wall_seconds": round(wall, 1),
        "server_alive_at_end": alive,
        "failures": len(failures),
        "failure_examples": failures[:5],
        "by_kind": by_kind,
        "queue_wait_ms": {"p50": percentile(waits, 0.5), "p99": percentile(waits, 0.99),
                          "max": max(waits) if waits else None},
        "rss_mb": {"first": round(warm_samples[0]["rss"] / 2**20, 1) if warm_samples else None,
                   "last": round(warm_samples[-1]["rss"] / 2**20, 1) if warm_samples else None,
                   "growth_pct": growth(warm_samples, "rss")},
        "mlx_active_mb": {
            "first": round(warm_samples[0]["mlx_active"] / 2**20, 2) if warm_samples else None,
            "last": round(warm_samples[-1]["mlx_active"] / 2**20, 2) if warm_samples else None,
            "growth_pct": growth(warm_samples, "mlx_active"),
            # Active memory while a request runs depends on that request;
            # a leak shows as a rising floor (what stays between requests).
            "floor_growth_pct": growth(warm_samples, "mlx_active", min)},
        "mlx_peak_mb": round(max(s["mlx_peak"] for s in warm_samples) / 2**20, 2)
        if warm_samples else None,
        "samples": len(samples),
    }
    checks = {
        "no unintended errors": not failures,
        "server alive": alive,
        "all requests done": len(results) == args.requests,
        f"RSS growth < {args.max_growth}%": (summary["rss_mb"]["growth_pct"] or 0) < args.max_growth,
        f"MLX active floor growth < {args.max_growth}%":
            (summary["mlx_active_mb"]["floor_growth_pct"] or 0) < args.max_growth,
    }
    summary["checks"] = checks
    print(json.dumps(summary, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"summary": summary, "samples": samples,
                                                   "results": results}, indent=1))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {name}")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
