"""One DFlash round at a real target's shape, ours beside z-lab's `dflash`
MLX code on the same checkpoints and prompts in one run, and the accept
length at which each breaks even with its own plain decoding, at a few
context lengths (long contexts are where DFlash ports lose today).

    python3 bench/dflash_round.py --shape qwen3.5-9b --contexts 1024 8192 [--flashbar B]

Random weights: the target is bench/vs_mlx_lm.py's checkpoint (mlx-lm's
init, 4-bit, bf16 scales), the drafter a 5-layer DFlash drafter at the
target's width in z-lab's layout (`drafter_config`: the Qwen3.5-9B
drafter's depth and taps), bf16 as published. A random drafter's drafts
are almost never accepted, so a round commits one token: what is timed is
the round's cost (draft + verify of 16 + rollback), whatever its
acceptance. A round that commits `accept` tokens pays when accept x plain
step >= round time, so the break-even accept length is round / step.

Ours: `flashbar bench --json` on the prompts (plain decoding, forced DFlash
and auto interleaved, `--repeats`), medians over the last repeat's forced
rounds (the round and its draft, verify and rollback parts) and its plain
steps. z-lab: its `stream_generate` (one response a round: the time between
responses) beside mlx-lm's (the time between tokens), each warmed up on the
first prompt. (On a CPU, mlx-lm's prefill of a hybrid model is a per-token
loop: minutes for a few hundred tokens of a large shape.) Writes the numbers to --json when given.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
from vs_mlx_lm import SHAPES, prompt_text, write_checkpoint  # noqa: E402

BLOCK = 16
DRAFTER_LAYERS = 5
DRAFTER_TAPS = 5


def drafter_config(target_dir: Path) -> dict:
    """A z-lab drafter config (the layout before 2026-06: full-attention
    layers, `block_size` at the top) at the target's width and vocabulary,
    its taps by z-lab's default rule (for 32 layers: [1, 8, 15, 22, 29], the
    published Qwen3.5-9B drafter's), the mask token the fixture tokenizer's."""
    import make_drafters

    text = json.loads((target_dir / "config.json").read_text())["text_config"]
    layers = text["num_hidden_layers"]
    taps = [round(1 + i * (layers - 4) / (DRAFTER_TAPS - 1)) for i in range(DRAFTER_TAPS)]
    hidden = text["hidden_size"]
    return {
        "model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": DRAFTER_LAYERS,
        "intermediate_size": 3 * hidden, "num_attention_heads": hidden // 128,
        "num_key_value_heads": max(1, hidden // 512), "head_dim": 128, "rms_norm_eps": 1e-6,
        "vocab_size": text["vocab_size"], "max_position_embeddings": 32768,
        "rope_theta": 10000000.0, "tie_word_embeddings": False, "num_target_layers": layers,
        "block_size": BLOCK, "layer_types": ["full_attention"] * DRAFTER_LAYERS,
        "dflash_config": {"mask_token_id": make_drafters.MASK_TOKEN_ID, "target_layer_ids": taps},
    }


def write_drafter(target_dir: Path, path: Path) -> dict:
    import make_drafters

    cfg = drafter_config(target_dir)
    if not (path / "config.json").is_file():
        draft = make_drafters.random_drafter(cfg, seed=5)
        make_drafters.save_drafter(path, cfg, draft, dtype=mx.bfloat16)
    return cfg


def median(values):
    values = list(values)
    return statistics.median(values) if values else float("nan")


def ours(flashbar: str, target: Path, drafter: Path, prompts: list, max_tokens: int, repeats: int):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(p.replace("\n", "\\n") for p in prompts) + "\n")
    out = subprocess.run(
        [flashbar, "bench", "--json", "--model", str(target), "--drafter", str(drafter),
         "--prompts", f.name, "--max-tokens", str(max_tokens), "--repeats", str(repeats),
         "--block-size", str(BLOCK)], check=True, capture_output=True, text=True)
    rows = []
    for report in json.loads(out.stdout)["prompts"]:
        rounds = [r for r in report["dflash"]["rounds"] if r["mode"] == "dflash"]
        row = {"prompt_tokens": report["prompt_tokens"], "rounds": len(rounds),
               "accept": statistics.mean(r["committed"] for r in rounds),
               "step_ms": median(r["round_ms"] for r in report["plain_rounds"]),
               # DFlash's tokens against plain decoding's, on this target and prompt.
               "lossless": report["dflash"]["token_ids"] == report["token_ids"]}
        for part in ("round_ms", "draft_ms", "verify_ms", "rollback_ms"):
            row[part] = median(r[part] for r in rounds)
        rows.append(row)
    return rows


def zlab(target: Path, drafter: Path, cfg: dict, prompts: list, max_tokens: int):
    import make_drafters
    from dflash import model_mlx
    from mlx_lm import stream_generate as mlx_lm_stream
    from mlx_lm.utils import load_model, load_tokenizer

    tokenizer = load_tokenizer(target)
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]

    def dflash_intervals(ids, tokens):
        model, _ = load_model(target)  # fresh: z-lab patches the layers it taps
        draft = model_mlx.DFlashDraftModel(make_drafters.zlab_config(cfg))
        draft.load_weights(str(drafter / "model.safetensors"))
        draft.set_dtype(mx.bfloat16)
        draft.bind(model)
        stamps, committed = [], []
        for response in model_mlx.stream_generate(model, draft, tokenizer, mx.array(ids),
                                                  max_tokens=tokens, temperature=0.0):
            stamps.append(time.perf_counter())
            if response.accepted is not None:
                committed.append(len(response.tokens))
        # The first response is the prefill's token; each later one a round.
        return [b - a for a, b in zip(stamps, stamps[1:])], committed

    plain, _ = load_model(target)

    def plain_intervals(ids, tokens):
        stamps = [time.perf_counter() for _ in mlx_lm_stream(plain, tokenizer, ids, max_tokens=tokens)]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    # Warm-ups on the first prompt: the kernels a round and a step use.
    dflash_intervals(prompt_ids[0], 4)
    plain_intervals(prompt_ids[0], 4)
    rows = []
    for ids in prompt_ids:
        rounds, committed = dflash_intervals(ids, max_tokens)
        steps = plain_intervals(ids, max_tokens)
        rows.append({"prompt_tokens": len(ids), "rounds": len(rounds),
                     "accept": statistics.mean(committed) if committed else float("nan"),
                     "round_ms": 1e3 * median(rounds), "step_ms": 1e3 * median(steps)})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=SHAPES, default="qwen3.5-9b")
    parser.add_argument("--dir", type=Path, default=None, help="the target checkpoint's folder")
    parser.add_argument("--flashbar", default="target/release/flashbar")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-reference", action="store_true", help="ours only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    target = args.dir or Path("target/bench") / f"{args.shape}-4bit"
    if not (target / "config.json").is_file():
        started = time.time()
        write_checkpoint(target, SHAPES[args.shape])
        print(f"wrote {target} in {time.time() - started:.0f} s", file=sys.stderr)
    drafter = target.parent / f"{target.name}-drafter{DRAFTER_LAYERS}"
    started = time.time()
    cfg = write_drafter(target, drafter)
    print(f"drafter {drafter} ready in {time.time() - started:.0f} s", file=sys.stderr)

    prompts = [prompt_text(context, target) for context in args.contexts]
    mine = ours(args.flashbar, target, drafter, prompts, args.max_tokens, args.repeats)
    print("ours: " + json.dumps(mine), flush=True)
    theirs = [None] * len(prompts)
    if not args.no_reference:
        try:
            theirs = zlab(target, drafter, cfg, prompts, args.max_tokens)
        except RuntimeError as err:  # e.g. MLX's CUDA graph cache (MLX_CUDA_GRAPH_CACHE_SIZE)
            print(f"z-lab's round failed: {err}")

    print(f"{target.name} with a random {DRAFTER_LAYERS}-layer drafter (taps "
          f"{cfg['dflash_config']['target_layer_ids']}), device {mx.default_device()}, block {BLOCK}, "
          f"{args.max_tokens} tokens; medians in ms; break-even = round / plain step")
    print(f"{'context':>8} | {'ours: round':>11} {'draft':>6} {'verify':>6} {'rollback':>8} "
          f"{'step':>6} {'break-even':>10} | {'z-lab: round':>12} {'mlx-lm step':>11} "
          f"{'break-even':>10} | {'round ours/z-lab':>16}")
    for a, b in zip(mine, theirs):
        line = (f"{a['prompt_tokens']:>8} | {a['round_ms']:>11.2f} {a['draft_ms']:>6.2f} "
                f"{a['verify_ms']:>6.2f} {a['rollback_ms']:>8.2f} {a['step_ms']:>6.2f} "
                f"{a['round_ms'] / a['step_ms']:>10.2f} |")
        if b is not None:
            line += (f" {b['round_ms']:>12.2f} {b['step_ms']:>11.2f} "
                     f"{b['round_ms'] / b['step_ms']:>10.2f} | {a['round_ms'] / b['round_ms']:>16.3f}")
        print(line)
    print("lossless (DFlash's tokens = plain decoding's): " + ", ".join(str(a["lossless"]) for a in mine))
    print("accept length per round (random drafter), ours / z-lab: " + ", ".join(
        f"{a['accept']:.2f} / {b['accept']:.2f}" if b else f"{a['accept']:.2f}"
        for a, b in zip(mine, theirs)))
    if args.json:
        args.json.write_text(json.dumps({"shape": args.shape, "drafter": cfg, "ours": mine,
                                         "zlab": theirs, "max_tokens": args.max_tokens}, indent=1))


if __name__ == "__main__":
    main()
