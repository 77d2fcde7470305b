"""Plain decoding speed, ours vs mlx-lm, side by side on the same random
4-bit checkpoint and the same prompt, in one run.

    .venv/bin/python bench/vs_mlx_lm.py --shape mid --flashbar target/release/flashbar

Writes the checkpoint (mlx-lm's own random init, quantized by mlx-lm) into
--dir if it is not there, runs mlx-lm's stream_generate and `flashbar bench`
on it, and prints prefill and decode tokens/s with ours/mlx-lm ratios. On a
GPU it also prints the decode roofline fraction: bytes of weights read per
token / step time, against --bandwidth (GB/s).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
import make_fixtures  # noqa: E402  (the tokenizer writer)

SHAPES = {
    # A few hundred M parameters: what the CPU benchmark uses.
    "mid": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=8,
                num_key_value_heads=2, head_dim=128, linear_num_key_heads=8,
                linear_key_head_dim=128, linear_num_value_heads=16,
                linear_value_head_dim=128, intermediate_size=3072, vocab_size=32768),
    # Qwen3.5-9B as its model card gives it.
    "qwen3.5-9b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                       linear_key_head_dim=128, linear_num_value_heads=32,
                       linear_value_head_dim=128, intermediate_size=12288, vocab_size=248320),
    # Qwen3.6-35B-A3B as its model card gives it: 256 experts, 8 a token,
    # each (and the shared expert) 512 wide. mlx-lm quantizes its router and
    # shared-expert gates at 8 bits, as its conversions of the model do.
    "qwen3.6-35b-a3b": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_key_head_dim=128, linear_num_value_heads=32,
                            linear_value_head_dim=128, intermediate_size=512,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, decoder_sparse_step=1,
                            norm_topk_prob=True, vocab_size=248320),
}


def write_checkpoint(path: Path, shape: dict, dtype: str = "bfloat16"):
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    text = dict(make_fixtures.TEXT, **shape)
    text["full_attention_interval"] = 4
    text["max_position_embeddings"] = 32768
    model_type = "qwen3_5_moe" if "num_experts" in shape else "qwen3_5"
    config = {"model_type": model_type, "text_config": text, "eos_token_id": 2}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    # Published conversions keep bf16 scales, biases and norms; f32 ones
    # would send every matmul to kernels that real checkpoints never meet.
    model.set_dtype(getattr(mx, dtype))
    model, qconfig = quantize_model(model, config, 64, 4)
    # Layer by layer, so the f32 random weights of one layer at a time are
    # in memory (the 35B-A3B's are 140 GB in all).
    for layer in model.language_model.model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    save_model(path, model)
    save_config(qconfig, path / "config.json")
    make_fixtures.write_tokenizer(path)


def prompt_text(tokens: int, tokenizer_dir: Path | None = None) -> str:
    """Text of about `tokens` tokens (about 1.35x that many with the
    fixture tokenizer); with `tokenizer_dir`, cut to `tokens` of that
    tokenizer's tokens (decoded; one more or less once encoded again)."""
    base = " ".join(make_fixtures.CORPUS[:8])
    text = base
    while len(text) < tokens * 4:
        text += " " + base
    if tokenizer_dir is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        text = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids[:tokens])
    return text


def gather_qmm_without_global_scale():
    """mlx-lm 0.32.2's MoE layers pass `global_scale` (None for affine
    weights) to `mx.gather_qmm`, which MLX 0.32.2 (the CUDA pack's) does not
    take: there, drop it when it is None."""
    original = mx.gather_qmm
    if "global_scale" in (original.__doc__ or ""):
        return

    def gather_qmm(*args, global_scale=None, **kwargs):
        if global_scale is not None:
            raise ValueError("this MLX's gather_qmm takes no global_scale")
        return original(*args, **kwargs)

    mx.gather_qmm = gather_qmm


def bench_mlx_lm(path: Path, prompt: str, max_tokens: int, repeats: int, short_warmup=False):
    from mlx_lm import load, stream_generate

    gather_qmm_without_global_scale()

    model, tokenizer = load(str(path))
    ids = tokenizer.encode(prompt, add_special_tokens=False)

    def once(n, prompt_ids=ids):
        last = None
        for response in stream_generate(model, tokenizer, prompt_ids, max_tokens=n):
            last = response
        return last

    # Warm-up: the whole prompt (a GPU compiles per shape), or its first 16
    # tokens (on a CPU, where mlx-lm's long prefill takes minutes).
    once(8, ids[:16] if short_warmup else ids)
    runs = [once(max_tokens) for _ in range(repeats)]
    return {
        "prompt_tokens": len(ids),
        "completion_tokens": runs[0].generation_tokens,
        "prefill": statistics.median(r.prompt_tps for r in runs),
        "decode": statistics.median(r.generation_tps for r in runs),
        "peak_memory_gb": max(r.peak_memory for r in runs),
    }


def bench_ours(binary: str, path: Path, prompt: str, max_tokens: int, repeats: int, env=None):
    prompts = path.parent / f"{path.name}.prompt.txt"
    prompts.write_text(prompt.replace("\n", "\\n") + "\n")
    out = subprocess.run(
        [binary, "bench", "--json", "--model", str(path), "--prompts", str(prompts),
         "--max-tokens", str(max_tokens), "--repeats", str(repeats)],
        capture_output=True, text=True, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        sys.exit(f"flashbar bench ({env or 'defaults'}) failed: {out.stderr.strip()[-2000:]}")
    whole = json.loads(out.stdout)
    report = whole["prompts"][0]
    return {
        "peak_memory_gb": whole["peak_memory_bytes"] / 1e9,
        "peak_after_load_gb": whole["peak_memory_after_load_bytes"] / 1e9,
        "peak_after_warmup_gb": whole["peak_memory_after_warmup_bytes"] / 1e9,
        "prompt_tokens": report["prompt_tokens"],
        "completion_tokens": report["completion_tokens"],
        "prefill": report["prefill_tokens_per_second"],
        "decode": report["decode_tokens_per_second"],
    }


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("model*.safetensors"))


def bytes_read_per_token(path: Path) -> int:
    """Every weight once, except the embedding table (one row per token) and,
    in a MoE, the experts a token does not meet (top-k of them)."""
    text = json.loads((path / "config.json").read_text()).get("text_config", {})
    active = text.get("num_experts_per_tok", 1) / text.get("num_experts", 1)
    skipped = 0.0
    for f in path.glob("model*.safetensors"):
        for name, array in mx.load(str(f)).items():
            if "embed_tokens" in name:
                skipped += array.nbytes
            elif "switch_mlp" in name:
                skipped += array.nbytes * (1.0 - active)
    return int(weight_bytes(path) - skipped)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=SHAPES, default="mid")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--flashbar", default="target/release/flashbar")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--exact-prompt", action="store_true",
                        help="cut the prompt to --prompt-tokens tokens (else ~1.35x that: 256 gave "
                             "the 346-token prompt of the runs in docs/performance.md)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="the checkpoint's float type (published conversions: bfloat16)")
    parser.add_argument("--short-warmup", action="store_true",
                        help="warm mlx-lm up on 16 prompt tokens, not the whole prompt (CPU)")
    parser.add_argument("--bandwidth", type=float, default=0.0,
                        help="memory bandwidth in GB/s for the roofline (4800 for an H200)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                        help="also run ours with these environment variables (a column each), "
                             "e.g. FLASHBAR_GDN_LAYER=0 for the gated-delta layers op by op")
    args = parser.parse_args()
    path = args.dir or Path("target/bench") / f"{args.shape}-4bit"
    if not (path / "config.json").is_file():
        started = time.time()
        write_checkpoint(path, SHAPES[args.shape], args.dtype)
        print(f"wrote {path} in {time.time() - started:.0f} s", file=sys.stderr)

    prompt = prompt_text(args.prompt_tokens, path if args.exact_prompt else None)
    theirs = bench_mlx_lm(path, prompt, args.max_tokens, args.repeats, args.short_warmup)
    ours = bench_ours(args.flashbar, path, prompt, args.max_tokens, args.repeats)
    variants = []
    for spec in args.also:
        env = dict(item.split("=", 1) for item in spec.split(","))
        variants.append((spec, bench_ours(args.flashbar, path, prompt, args.max_tokens,
                                          args.repeats, env)))
    if ours["prompt_tokens"] != theirs["prompt_tokens"]:
        print(f"warning: prompt lengths differ: {ours['prompt_tokens']} vs {theirs['prompt_tokens']}")

    name = path.name if args.dir else f"{args.shape} 4-bit"
    print(f"{name}, {weight_bytes(path) / 1e9:.2f} GB of weights, "
          f"device {mx.default_device()}, prompt {theirs['prompt_tokens']} tokens, "
          f"{args.max_tokens} generated, median of {args.repeats}")
    print(f"{'':10}{'flashbar':>12}{'mlx-lm':>12}{'ratio':>9}")
    for key in ("prefill", "decode"):
        print(f"{key + ' tok/s':<16}{ours[key]:>8.1f}{theirs[key]:>12.1f}{ours[key] / theirs[key]:>9.2f}x")
    print(f"peak memory: flashbar {ours['peak_memory_gb']:.2f} GB (after the load "
          f"{ours['peak_after_load_gb']:.2f}, after a warm-up answer {ours['peak_after_warmup_gb']:.2f}), "
          f"mlx-lm {theirs['peak_memory_gb']:.2f} GB")
    for spec, run in variants:
        print(f"flashbar with {spec}: " + ", ".join(
            f"{key} {run[key]:.1f} tok/s ({run[key] / theirs[key]:.2f}x mlx-lm, "
            f"default {ours[key] / run[key]:.2f}x this)" for key in ("prefill", "decode")))
    if args.bandwidth > 0:
        bytes_per_token = bytes_read_per_token(path)
        for name, run in (("flashbar", ours), ("mlx-lm", theirs), *variants):
            fraction = bytes_per_token * run["decode"] / (args.bandwidth * 1e9)
            print(f"{name} decode roofline: {100 * fraction:.1f}% of {args.bandwidth:.0f} GB/s")


if __name__ == "__main__":
    main()
