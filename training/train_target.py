"""Step 1: the corpus, the tokenizer and the target.

    python training/train_target.py OUT [--smoke]

Reads the Python sources (code + docstrings) of permissively licensed
packages installed in this Python (common.CORPUS_PACKAGES), trains a 4096-token
byte-level BPE on them, then trains the Qwen3.5-architecture hybrid target
from scratch for a fixed number of steps. Writes OUT/target-raw (MLX format,
bf16, with the tokenizer), OUT/corpus.npz (token stream, held-out split) and
OUT/train_target.json (settings, losses, timings). Deterministic in --seed.
"""

import argparse
import json
import math
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

import common


def build_corpus(args, out: Path):
    files = common.corpus_files(int(args.corpus_mb * 1e6))
    texts = [common.read_text(path) for _, path in files]
    held_out = [i % 50 == 0 for i in range(len(texts))]
    train_texts = [t for t, h in zip(texts, held_out) if not h]
    tokenizer = common.train_tokenizer(train_texts, common.TARGET_TEXT["vocab_size"], out / "target-raw")
    eot = tokenizer.token_to_id(common.ENDOFTEXT)

    def stream(selected):
        ids = []
        for encoding in tokenizer.encode_batch(selected):
            ids.extend(encoding.ids)
            ids.append(eot)
        return np.asarray(ids, dtype=np.int32)

    train = stream(train_texts)
    valid = stream([t for t, h in zip(texts, held_out) if h])
    np.savez(out / "corpus.npz", train=train, valid=valid)
    packages = {}
    for package, path in files:
        packages.setdefault(package, [0, 0])
        packages[package][0] += 1
        packages[package][1] += path.stat().st_size
    return tokenizer, train, valid, {
        "files": len(files), "bytes": sum(len(t.encode()) for t in texts),
        "train_tokens": int(train.size), "valid_tokens": int(valid.size),
        "packages": {p: {"files": n, "bytes": b, "licence": common.CORPUS_PACKAGES[p],
                         "version": package_version(p)} for p, (n, b) in packages.items()},
    }


def package_version(package: str) -> str:
    from importlib import metadata

    names = {"sklearn": "scikit-learn", "attr": "attrs", "yaml": "PyYAML"}
    try:
        return metadata.version(names.get(package, package))
    except metadata.PackageNotFoundError:
        return "unknown"


def batches(tokens: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, tokens.size - seq - 1, size=batch)
        window = np.stack([tokens[s:s + seq + 1] for s in starts])
        yield mx.array(window[:, :-1]), mx.array(window[:, 1:])


def loss_fn(model, inputs, targets):
    logits = model(inputs)
    return nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="mean")


def evaluate(model, tokens: np.ndarray, seq: int, batches_n: int = 8) -> float:
    rng = np.random.default_rng(0)
    data = batches(tokens, 16, seq, rng)
    return float(np.mean([loss_fn(model, *next(data)).item() for _ in range(batches_n)]))


def make_trainer(args, steps: int, with_model: bool = False):
    """A compiled training step (returns the loss, evaluated) over a fresh
    target: warm-up of 100 steps, then cosine decay to lr/10 at `steps`."""
    model = common.build_target()
    mx.eval(model.parameters())
    warmup = min(100, steps // 2)
    schedule = optim.join_schedules(
        [optim.linear_schedule(args.lr / 100, args.lr, max(1, warmup)),
         optim.cosine_decay(args.lr, max(1, steps - warmup), args.lr / 10)], [max(1, warmup)])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.1, betas=[0.9, 0.95])
    state = [model.state, optimizer.state]

    def compiled(inputs, targets):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, inputs, targets)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    if args.compile:
        compiled = mx.compile(compiled, inputs=state, outputs=state)

    def step(inputs, targets):
        loss = compiled(inputs, targets)
        mx.eval(state, loss)
        return loss

    if with_model:
        print(f"target: {common.count_params(model) / 1e6:.2f} M parameters", flush=True)
        return step, model
    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-mb", type=float, default=60)
    parser.add_argument("--steps", type=int, default=0, help="0: as many as fit --max-minutes")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--max-minutes", type=float, default=7.0,
                        help="stop early (recorded) if the steps do not fit")
    parser.add_argument("--smoke", action="store_true", help="tiny run for a CPU check")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip mx.compile (its first trace of the chunked GDN costs minutes)")
    args = parser.parse_args()
    if args.smoke:
        args.corpus_mb, args.batch, args.seq = 1.0, 2, 64
        args.steps = args.steps or 6
    args.out.mkdir(parents=True, exist_ok=True)
    common.seed_everything(args.seed)
    started = time.time()
    tokenizer, train, valid, corpus = build_corpus(args, args.out)
    probe_data = batches(train, args.batch, args.seq, np.random.default_rng(args.seed + 1))
    print(f"corpus: {corpus['files']} files, {corpus['bytes'] / 1e6:.1f} MB, "
          f"{corpus['train_tokens'] / 1e6:.2f} M train tokens ({time.time() - started:.0f} s)", flush=True)

    common.use_chunked_gdn()
    if args.steps == 0:  # as many as fit the time left, measured on a throwaway model
        probe = make_trainer(args, 100)
        args.steps = common.plan_steps(lambda: probe(*next(probe_data)), args.max_minutes * 60
                                       - (time.time() - started) - 60)
        del probe
    mx.random.seed(args.seed)
    step, model = make_trainer(args, args.steps, with_model=True)
    data = batches(train, args.batch, args.seq, np.random.default_rng(args.seed))
    log, t0, done = [], time.time(), 0
    for done in range(1, args.steps + 1):
        loss = step(*next(data))
        if done % 100 == 0 or done == args.steps or done <= 2:
            elapsed = time.time() - t0
            rate = done * args.batch * args.seq / elapsed
            log.append({"step": done, "loss": loss.item(), "seconds": round(elapsed, 1)})
            print(f"step {done}: loss {loss.item():.3f}, {rate / 1e3:.0f} k tok/s", flush=True)
            if not math.isfinite(loss.item()):
                raise SystemExit(f"training diverged at step {done}")
        if time.time() - started > args.max_minutes * 60:
            print(f"stopping at step {done}: time limit", flush=True)
            break
    model.set_dtype(mx.bfloat16)
    valid_loss = evaluate(model, valid, args.seq, 2 if args.smoke else 8)
    from mlx_lm.utils import save_config, save_model

    save_model(args.out / "target-raw", model)
    save_config(common.hf_config(), args.out / "target-raw" / "config.json")
    report = {"seed": args.seed, "steps_planned": args.steps, "steps_done": done,
              "batch": args.batch, "seq": args.seq, "lr": args.lr,
              "parameters": common.count_params(model), "valid_loss_bf16": valid_loss,
              "valid_ppl": math.exp(valid_loss), "train_seconds": round(time.time() - t0, 1),
              "corpus": corpus, "log": log}
    (args.out / "train_target.json").write_text(json.dumps(report, indent=2))
    print(f"valid loss {valid_loss:.3f} (bf16), {time.time() - started:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
