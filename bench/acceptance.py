"""The acceptance report of a target + DFlash drafter pair: our engine and
z-lab's `dflash` MLX code on the same pair and prompts, side by side.

    python bench/acceptance.py [--model models/default/target] [--drafter models/default/drafter]
                               [--flashbar target/release/flashbar] [--json docs/acceptance.json]

Per regime (deterministic, code, prose-like) it prints: the target's output
entropy (bits per token along the greedy path), the mean accept length per
DFlash round (accepted drafts + 1, block 16) for ours and for z-lab, whether
the two agree round by round and token by token (greedy decoding must), and
decode tok/s: ours DFlash and auto vs ours plain AR (`flashbar bench`,
interleaved repeats in one process, each mode's tokens checked equal to plain
decoding's; pooled over all repeats, and warm: over the last half, where the
prompt's shapes were met before), z-lab DFlash vs mlx-lm plain AR (Python,
same run). The JSON
keeps every round's recorded costs, which the gate's tests replay.
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

LICENCE = ("# Licensed under the Apache License, Version 2.0 (the \"License\");\n"
           "# you may not use this file except in compliance with the License.\n"
           "# You may obtain a copy of the License at\n#\n"
           "#     http://www.apache.org/licenses/LICENSE-2.0\n#\n")
PROMPTS = {
    "deterministic": [
        LICENCE + "\n" + LICENCE,
        "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,",
        "x = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,",
        "    a = 0\n    a = 0\n    a = 0\n    a = 0\n",
    ],
    "code": [
        "def fib(n):",
        "import numpy as np\n\n\ndef softmax(x):\n",
        "class Stack:\n    def __init__(self):\n",
        "    for i in range(len(values)):\n",
    ],
    "prose": [
        '    """Return the',
        "# This function computes",
        '"""\nUtilities for reading and writing',
        "    Parameters\n    ----------\n",
    ],
}
# Four more a regime (`--wide`): with four, one answer that leaves the
# drafter's path early moves a regime's mean by ~0.3 (docs/acceptance.md).
MORE_PROMPTS = {
    "deterministic": [
        "10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140,",
        "    self.assertEqual(a, 1)\n    self.assertEqual(a, 1)\n    self.assertEqual(a, 1)\n",
        "['a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c',",
        ("#" * 40 + "\n") * 3,
    ],
    "code": [
        "    def __repr__(self):\n",
        "if __name__ == \"__main__\":\n",
        "try:\n    import json\nexcept ImportError:\n",
        "    def forward(self, x):\n",
    ],
    "prose": [
        "# TODO: this is",
        "    Returns\n    -------\n",
        "    Raises\n    ------\n",
        '"""A small library for',
    ],
}
BLOCK = 16


COST_KEYS = ("mode", "committed", "draft_ms", "verify_ms", "rollback_ms", "round_ms")


def ours(flashbar: Path, model: Path, drafter: Path, prompts: list, max_tokens: int, repeats: int,
         stderr: Path | None = None):
    """`flashbar bench` over all prompts in one process: plain decoding,
    forced DFlash and auto interleaved per repeat (their order turned around
    every repeat: `flashbar bench`), each run's tokens and the
    rounds of its last repeat."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(p.replace("\n", "\\n") for p in prompts) + "\n")
    bench = subprocess.run(
        [str(flashbar), "bench", "--model", str(model), "--drafter", str(drafter), "--prompts", f.name,
         "--max-tokens", str(max_tokens), "--repeats", str(repeats), "--block-size", str(BLOCK),
         "--json"], check=True, capture_output=True, text=True)
    if stderr:  # the engine's log (RUST_LOG=flashbar_engine=debug: a line per shadow probe)
        stderr.write_text(bench.stderr)
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(model)
    out = []
    for prompt, report in zip(prompts, json.loads(bench.stdout)["prompts"]):
        fast, auto = report["dflash"], report["auto"]
        out.append({"tokens": report["token_ids"],
                    "prompt_ids": tokenizer.encode(prompt, add_special_tokens=False), "dflash_tokens": fast["token_ids"],
                    "auto_tokens": auto["token_ids"],
                    "rounds": [r["committed"] for r in fast["rounds"] if r["mode"] == "dflash"],
                    "round_costs": [{k: r[k] for k in COST_KEYS} for r in fast["rounds"]],
                    # The gate's choices and what it saw (round_ms from the end of
                    # the previous round or step, as the gate times it; speedup
                    # against its own plain step time).
                    "auto_rounds": [{k: r[k] for k in ("mode", "committed", "gate", "round_ms", "speedup")}
                                    for r in auto["rounds"]],
                    "first_round_costs": [{k: r[k] for k in COST_KEYS} for r in fast["first_rounds"]],
                    # plain decoding's steps (its last run), beside auto's
                    "plain_step_ms": [r["round_ms"] for r in report["plain_rounds"]],
                    "ar_tps": report["decode_tokens_per_second"],
                    "dflash_tps": fast["decode_tokens_per_second"],
                    "auto_tps": auto["decode_tokens_per_second"],
                    # over the last half of the repeats (warm: the prompt's shapes seen before)
                    "dflash_end_speedup": fast["end_speedup"], "auto_end_speedup": auto["end_speedup"]})
    return out


def zlab(model_dir: Path, drafter_dir: Path, prompts: list, max_tokens: int):
    from make_drafters import zlab_config
    from mlx_lm import stream_generate as mlx_lm_stream
    from mlx_lm.utils import load_model, load_tokenizer

    from dflash import model_mlx

    tokenizer = load_tokenizer(model_dir)
    cfg = json.loads((drafter_dir / "config.json").read_text())
    out = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        model, _ = load_model(model_dir)  # fresh: z-lab patches the layers it taps
        draft = model_mlx.DFlashDraftModel(zlab_config(cfg))
        draft.load_weights(str(drafter_dir / "model.safetensors"))
        draft.set_dtype(mx.bfloat16)
        draft.bind(model)
        tokens, rounds, start = [], [], None
        for response in model_mlx.stream_generate(model, draft, tokenizer, mx.array(ids),
                                                  max_tokens=max_tokens, temperature=0.0):
            if start is None:
                start = time.perf_counter()
            elif response.accepted is not None:
                rounds.append(len(response.tokens))
            tokens.extend(response.tokens)
        dflash_tps = (len(tokens) - 1) / (time.perf_counter() - start)
        plain, _ = load_model(model_dir)
        start, count = None, 0
        for response in mlx_lm_stream(plain, tokenizer, ids, max_tokens=max_tokens):
            count += 1
            if start is None:
                start = time.perf_counter()
        ar_tps = (count - 1) / (time.perf_counter() - start)
        out.append({"tokens": tokens, "rounds": rounds, "dflash_tps": dflash_tps, "ar_tps": ar_tps,
                    "prompt_ids": ids})
    return out


def entropy_bits(model_dir: Path, prompt_ids: list, tokens: list) -> float:
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir)
    logits = model(mx.array([prompt_ids + tokens]))[0, len(prompt_ids) - 1:-1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return float((-(mx.exp(logp) * logp).sum(-1)).mean().item() / math.log(2))


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def median(values):
    values = sorted(values)
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=ROOT / "models/default/target")
    parser.add_argument("--drafter", type=Path, default=ROOT / "models/default/drafter")
    parser.add_argument("--flashbar", type=Path, default=ROOT / "target/release/flashbar")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stderr", type=Path, help="write flashbar's log here, FILE.REGIME.txt a regime")
    parser.add_argument("--no-reference", action="store_true",
                        help="ours only (z-lab and mlx-lm take most of the run on a CPU)")
    parser.add_argument("--wide", action="store_true",
                        help="eight prompts a regime: the four above and MORE_PROMPTS' four")
    args = parser.parse_args()
    results = {}
    for regime, prompts in PROMPTS.items():
        if args.wide:
            prompts = prompts + MORE_PROMPTS[regime]
        a = ours(args.flashbar, args.model, args.drafter, prompts, args.max_tokens, args.repeats,
                 args.stderr and args.stderr.with_suffix(f".{regime}.txt"))
        b = (zlab(args.model, args.drafter, prompts, args.max_tokens) if not args.no_reference
             else [None] * len(prompts))
        rows = []
        for prompt, x, y in zip(prompts, a, b):
            compared = y is not None
            if not compared:  # --no-reference: no z-lab run; its columns read nan / None
                y = {"tokens": [], "rounds": [], "dflash_tps": float("nan"),
                     "ar_tps": float("nan"), "prompt_ids": x["prompt_ids"]}
            n = min(len(x["rounds"]), len(y["rounds"])) - 1  # the last round may be cut at max_tokens
            rows.append({
                "prompt": prompt,
                "entropy_bits": entropy_bits(args.model, x["prompt_ids"], x["tokens"]),
                "ours_accept": mean(x["rounds"]), "zlab_accept": mean(y["rounds"]),
                "rounds_agree": (x["rounds"][:n] == y["rounds"][:n] and n >= 0) if compared else None,
                "tokens_agree": x["tokens"] == y["tokens"][:len(x["tokens"])] if compared else None,
                "lossless": x["dflash_tokens"] == x["tokens"] and x["auto_tokens"] == x["tokens"],
                "ours_ar_tps": x["ar_tps"], "ours_dflash_tps": x["dflash_tps"],
                "ours_auto_tps": x["auto_tps"], "round_costs": x["round_costs"],
                "first_round_costs": x["first_round_costs"],
                "ours_warm_speedup": x["dflash_end_speedup"], "ours_warm_auto_speedup": x["auto_end_speedup"],
                "auto_rounds": x["auto_rounds"], "plain_step_ms": x["plain_step_ms"],
                "zlab_ar_tps": y["ar_tps"], "zlab_dflash_tps": y["dflash_tps"],
                "ours_rounds": x["rounds"], "zlab_rounds": y["rounds"],
            })
        results[regime] = {
            "entropy_bits": mean(r["entropy_bits"] for r in rows),
            "ours_accept": mean(r["ours_accept"] for r in rows),
            "zlab_accept": mean(r["zlab_accept"] for r in rows),
            "reference": not args.no_reference,
            "rounds_agree": all(r["rounds_agree"] for r in rows) if not args.no_reference else None,
            "tokens_agree": all(r["tokens_agree"] for r in rows) if not args.no_reference else None,
            "lossless": all(r["lossless"] for r in rows),
            "ours_speedup": mean(r["ours_dflash_tps"] / r["ours_ar_tps"] for r in rows),
            "ours_auto_speedup": mean(r["ours_auto_tps"] / r["ours_ar_tps"] for r in rows),
            "ours_auto_min_speedup": min(r["ours_auto_tps"] / r["ours_ar_tps"] for r in rows),
            "ours_auto_tps": mean(r["ours_auto_tps"] for r in rows),
            "ours_warm_speedup": mean(r["ours_warm_speedup"] for r in rows),
            "ours_warm_auto_speedup": mean(r["ours_warm_auto_speedup"] for r in rows),
            "ours_warm_auto_min_speedup": min(r["ours_warm_auto_speedup"] for r in rows),
            "first_round_ms": mean(c["draft_ms"] + c["verify_ms"] + c["rollback_ms"]
                                   for r in rows for c in r["first_round_costs"] if c["mode"] == "dflash"),
            "last_round_ms": mean(c["draft_ms"] + c["verify_ms"] + c["rollback_ms"]
                                  for r in rows for c in r["round_costs"] if c["mode"] == "dflash"),
            # where a round's time goes (the last repeat's DFlash rounds,
            # medians): what a deeper drafter costs (docs/acceptance.md,
            # "What a deeper drafter must earn")
            "draft_ms_median": median(c["draft_ms"] for r in rows for c in r["round_costs"]
                                      if c["mode"] == "dflash"),
            "verify_ms_median": median(c["verify_ms"] for r in rows for c in r["round_costs"]
                                       if c["mode"] == "dflash"),
            "plain_step_ms_median": median(t for r in rows for t in r["plain_step_ms"]),
            # what a drafter's shape is chosen by: tokens a DFlash round
            # commits per millisecond of a warm round (docs/acceptance.md,
            # "Grown and trained")
            "tokens_per_round_ms": mean(r["ours_accept"] for r in rows)
            / mean(c["draft_ms"] + c["verify_ms"] + c["rollback_ms"]
                   for r in rows for c in r["round_costs"] if c["mode"] == "dflash"),
            "zlab_speedup": mean(r["zlab_dflash_tps"] / r["zlab_ar_tps"] for r in rows),
            "ours_dflash_tps": mean(r["ours_dflash_tps"] for r in rows),
            "ours_ar_tps": mean(r["ours_ar_tps"] for r in rows),
            "prompts": rows,
        }
        if args.wide:  # the goals are stated on PROMPTS, the first of the eight
            goals = rows[:len(PROMPTS[regime])]
            results[regime]["goals_prompts"] = {
                "ours_accept": mean(r["ours_accept"] for r in goals),
                "ours_speedup": mean(r["ours_dflash_tps"] / r["ours_ar_tps"] for r in goals),
                "ours_auto_speedup": mean(r["ours_auto_tps"] / r["ours_ar_tps"] for r in goals),
                "ours_auto_min_speedup": min(r["ours_auto_tps"] / r["ours_ar_tps"] for r in goals),
            }
    print(f"device {mx.default_device()}, drafter {args.drafter}")
    print(f"{'regime':<14}{'entropy':>8}{'accept ours':>12}{'z-lab':>7}{'agree':>7}{'lossless':>9}"
          f"{'AR tok/s':>10}{'DFlash/AR':>10}{'auto/AR':>9}{'(min)':>7}{'z-lab DFlash/AR':>16}")
    for regime, r in results.items():
        print(f"{regime:<14}{r['entropy_bits']:>8.2f}{r['ours_accept']:>12.2f}{r['zlab_accept']:>7.2f}"
              f"{str(r['rounds_agree'] and r['tokens_agree']):>7}{str(r['lossless']):>9}"
              f"{r['ours_ar_tps']:>10.1f}{r['ours_speedup']:>9.2f}x{r['ours_auto_speedup']:>8.2f}x"
              f"{r['ours_auto_min_speedup']:>6.2f}x{r['zlab_speedup']:>15.2f}x")
    print("over the last half of the repeats (warm), and a DFlash round's mean cost in the first and last repeat:")
    print(f"{'regime':<14}{'DFlash/AR':>10}{'auto/AR':>9}{'(min)':>7}{'round ms first':>16}{'last':>7}"
          f"{'| medians: draft':>17}{'verify':>8}{'plain step':>12}{'| tokens a round ms':>20}")
    for regime, r in results.items():
        print(f"{regime:<14}{r['ours_warm_speedup']:>9.2f}x{r['ours_warm_auto_speedup']:>8.2f}x"
              f"{r['ours_warm_auto_min_speedup']:>6.2f}x{r['first_round_ms']:>16.2f}{r['last_round_ms']:>7.2f}"
              f"{r['draft_ms_median']:>17.2f}{r['verify_ms_median']:>8.2f}{r['plain_step_ms_median']:>12.3f}"
              f"{r['tokens_per_round_ms']:>20.2f}")
    if args.wide:
        print("the goals' prompts alone (the first of each regime's eight):")
        print(f"{'regime':<14}{'accept ours':>12}{'DFlash/AR':>10}{'auto/AR':>9}{'(min)':>7}")
        for regime, r in results.items():
            g = r["goals_prompts"]
            print(f"{regime:<14}{g['ours_accept']:>12.2f}{g['ours_speedup']:>9.2f}x"
                  f"{g['ours_auto_speedup']:>8.2f}x{g['ours_auto_min_speedup']:>6.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": str(args.model), "drafter": str(args.drafter),
                                         "device": str(mx.default_device()), "block": BLOCK,
                                         "max_tokens": args.max_tokens, "regimes": results}, indent=2))


if __name__ == "__main__":
    main()
