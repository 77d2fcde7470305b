"""GPU kernels launched per decode step, and their GPU time, counted with
Nsight Compute on `flashbar generate` (NVIDIA only).

    python3 bench/launch_counts.py --flashbar B --model DIR [--also NAME=VALUE]

Runs `flashbar generate --speculation off` twice under `ncu`, for a few and
for more tokens, and divides the difference in kernels by the difference in
tokens, so prefill and loading cancel out. Beside each family it prints the
mean GPU time of one of its kernels in the longer run (prefill included, so
for MLX's families a mix; our row-invariant kernels run only in decode
steps). A difference of summed times is too noisy under ncu to use.
Kernels are grouped by name (ours by their `flashbar_<body>` names, MLX's by
its kernel families). `--also` repeats the count with environment variables
set (e.g. FLASHBAR_GDN_LAYER=0: the gated-delta layers op by op).
`--dflash DRAFTER` counts a forced DFlash round instead (draft, verify of
the block, rollback): the same two runs with `--speculation dflash`,
divided by the difference in rounds (bench/dflash_round.py makes a random
drafter for a bench checkpoint; its rounds commit one token each).
`--sequence` also prints the kernels of one decode step (one round) in the
order they ran, runs of a name folded (`name x N`): where each copy sits.
"""

import argparse
import collections
import csv
import io
import json
import os
import subprocess
import tempfile
from pathlib import Path

GROUPS = [
    ("ours: quantized matmul", "flashbar_qmm"),
    ("ours: gated-delta layer", "flashbar_gdn_layer"),
    ("ours: gated-delta recurrence", "flashbar_gdn_record"),
    ("ours: gated-delta replay (rollback)", "flashbar_gdn_replay"),
    ("ours: attention", "flashbar_attn"),
    ("ours: conv", "flashbar_conv"),
    ("ours: other", "flashbar_"),
    ("MLX quantized matmul", "qmv"),
    ("MLX quantized matmul", "qmm"),
    ("RMS norm", "rms"),
    ("RoPE", "rope"),
    ("copy", "copy"),
    ("gather / scatter / slice", "gather"),
    ("gather / scatter / slice", "scatter"),
    ("gather / scatter / slice", "slice"),
    ("reduction", "reduce"),
    ("arg reduction", "arg_reduce"),
    ("softmax", "softmax"),
    ("matmul (cuBLAS)", "gemm"),
    ("matmul (cuBLAS)", "gemv"),
    ("elementwise", "binary"),
    ("elementwise", "unary"),
    ("elementwise", "ternary"),
    ("elementwise", "compiled"),
]


def group(name: str) -> str:
    lower = name.lower()
    for label, key in GROUPS:
        if key in lower:
            return label
    return "other"


def profile(binary, model, prompt, tokens, env, drafter=None):
    """(tokens generated, rounds, kernel counts, GPU ns) of one generate
    run under ncu: plain decoding, or forced DFlash with `drafter`."""
    mode = ["--speculation", "off"] if drafter is None else [
        "--speculation", "dflash", "--drafter", str(drafter)]
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "ncu.csv"
        out = subprocess.run(
            ["ncu", "--clock-control", "none", "--csv", "--page", "raw",
             "--metrics", "gpu__time_duration.sum", "--log-file", str(log),
             binary, "generate", "--json", "--model", str(model), *mode,
             "--max-tokens", str(tokens), prompt],
            check=True, capture_output=True, text=True, env={**os.environ, **env})
        generated = rounds = None
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                stats = json.loads(line)["stats"]
                generated, rounds = stats["completion_tokens"], stats["rounds"]
        text = log.read_text()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    rows = [r for r in rows if r.get("ID", "").isdigit()]  # drop the units row
    counts, times = collections.Counter(), collections.Counter()
    names = [(row["Kernel Name"], float(row.get("gpu__time_duration.sum", "0").replace(",", "") or 0))
             for row in rows]
    for name, ns in names:
        label = group(name)
        counts[label] += 1
        times[label] += ns
    return (generated if drafter is None else rounds), counts, times, names


def last_unit(names, dflash, per_unit):
    """With `dflash`, the kernels of the run's last full round: from after
    one rollback's replays to the end of the next (a random drafter's rounds
    all roll back). Else the run's last `per_unit` kernels: a decode step's
    worth, not cut at a step's start (no kernel name marks it)."""
    if not dflash:
        return names[-per_unit:]
    # A rollback: replays (one a gated-delta layer) at most 3 kernels apart
    # (a layer's conv-state rows may be copied between them).
    replays = [i for i, (n, _) in enumerate(names) if "flashbar_gdn_replay" in n]
    ends = [i for i, nxt in zip(replays, replays[1:] + [None]) if nxt is None or nxt - i > 4]
    if len(ends) < 3:
        return []
    return names[ends[-3] + 1:ends[-2] + 1]


def folded(names):
    """`name x N  [us]` for each run of one name (the names cut to their
    first 60 characters), with the run's summed GPU time."""
    out = []
    for name, ns in names:
        short = name.split("(")[0][:60]
        if out and out[-1][0] == short:
            out[-1][1] += 1
            out[-1][2] += ns
        else:
            out.append([short, 1, ns])
    return [f"{n}{f' x {c}' if c > 1 else ''}  [{ns / 1e3:.1f} us]" for n, c, ns in out]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flashbar", required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--prompt", default="The quick brown fox")
    parser.add_argument("--tokens", type=int, nargs=2, default=[2, 6])
    parser.add_argument("--also", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]")
    parser.add_argument("--dflash", type=Path, default=None, metavar="DRAFTER",
                        help="count forced DFlash rounds with this drafter instead of decode steps")
    parser.add_argument("--sequence", action="store_true",
                        help="also print one step's (round's) kernels in order")
    args = parser.parse_args()
    unit = "decode step" if args.dflash is None else "DFlash round"
    runs = [("default", {})] + [
        (spec, dict(item.split("=", 1) for item in spec.split(","))) for spec in args.also]
    for label, env in runs:
        (t1, c1, s1, _), (t2, c2, s2, names) = (
            profile(args.flashbar, args.model, args.prompt, n, env, args.dflash) for n in args.tokens)
        if t1 is None or t2 is None or t2 <= t1:
            print(f"{label}: could not read the {unit} counts ({t1}, {t2})")
            continue
        steps = t2 - t1
        total = (sum(c2.values()) - sum(c1.values())) / steps
        print(f"{args.model.name}, {label}: {total:.0f} kernels per {unit} "
              f"({steps} of them); per family: kernels each, mean us a kernel (ncu's ns / 1e3)")
        for name in sorted(set(c1) | set(c2), key=lambda n: -(c2[n] - c1[n])):
            per_step = (c2[name] - c1[name]) / steps
            if per_step:
                print(f"  {name:<30}{per_step:>7.1f}  {s2[name] / c2[name] / 1e3:>8.1f} us")
        if args.sequence:
            unit_names = last_unit(names, args.dflash is not None, round(total))
            # Each kernel's time alone (ncu serializes them and flushes the
            # caches before each), summed: the GPU's share of a step, beside
            # the step's wall time, says how much of it is gaps between kernels.
            spent = collections.Counter()
            for name, ns in unit_names:
                spent[group(name)] += ns
            print(f"  the last {unit}'s kernels, each timed alone: "
                  f"{sum(spent.values()) / 1e6:.3f} ms in all; by family:")
            for name, ns in spent.most_common():
                print(f"    {name:<34}{ns / 1e3:>9.1f} us")
            print(f"  the last {unit}'s {len(unit_names)} kernels in order:")
            for line in folded(unit_names):
                print(f"    {line}")


if __name__ == "__main__":
    main()
