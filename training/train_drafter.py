"""Step 2: self-distillation data and the DFlash drafter.

    python training/train_drafter.py OUT [--target DIR] [--layers N] [--taps 0,2,4]
                                         [--tag NAME] [--distill-only] [--smoke]

Reads the target (--target, default OUT/target-raw from step 1, else the
committed models/default/target) and OUT/corpus.npz. The frozen target writes
its own continuations of corpus windows (prompt 64 + 192 generated tokens;
greedy, and the last --sampled-fraction of them at temperature 0.7), cached
in OUT/sequences.npz so several drafter shapes can train on the same data
(`--distill-only` writes it and stops); its tap hidden states over those
sequences are the drafter's context. The drafter (z-lab's DFlash format and module) trains by the DFlash
recipe: many anchors per sequence in the generated part, each a block of the
real anchor token followed by mask tokens, seeing the context before its
anchor and itself (bidirectionally); cross-entropy on the block's positions
1..15 against the target's greedy tokens, weighted by exp(-(k-1)/gamma) so
early positions, which gate acceptance, count most. The target's embedding
and lm_head are used frozen. Writes OUT/drafter[-TAG] (bf16) and
OUT/train_drafter[-TAG].json: an offline acceptance estimate on held-out
greedy sequences (mean accept length, the share of blocks reaching each
position, the loss at each block position), the drafter's size and the time
of one inference forward on this machine. Deterministic in --seed and
--steps.

`--init DIR` starts from a trained drafter's weights (same shape) instead of
random ones: a fine-tune that continues a run a call's time limit cut short,
on fresh sequences. With --layers above DIR's, the drafter grows: the added
layers start as the identity (load_grown), so training starts from DIR's
drafter with room to improve on it. The report keeps the starting drafter's sha256, its own
report (from DIR/../manifest.json when DIR is an exported pair's drafter)
and its held-out accept length on this run's held-out rows, measured before
the first step, so the two are compared on the same data.
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

import common
from make_drafters import save_drafter, zlab_config

from dflash import model_mlx as zlab


SAMPLING_TEMPERATURE = 0.7
HELD_OUT = 1024
# Below this, distilled tokens are not the target's (torch_distill.py measured 0.96
# on the committed bf16 target, docs/acceptance.md).
MIN_AGREEMENT = 0.9


def is_sampled(index: int, fraction: float) -> bool:
    """Whether sequence `index` is drawn at SAMPLING_TEMPERATURE: every
    1/fraction-th row, interleaved, so any prefix of the set (a run cut by
    its deadline) holds the same share of sampled rows."""
    return int((index + 1) * fraction) > int(index * fraction)


def distill(model, corpus: np.ndarray, count: int, prompt: int, generate: int,
            batch: int, rng, fraction: float, deadline: float = 0.0, sync: bool = False) -> np.ndarray:
    """Up to count sequences (fewer if `deadline`, a unix time, passes
    first; one batch at least): a corpus window of `prompt` tokens + the
    target's continuation of `generate` tokens, greedy, or sampled for the
    rows `is_sampled` picks. The next step's graph is built while the GPU runs this one
    (async_eval), as mlx-lm's own generation loop does, unless `sync`."""
    schedule = mx.eval if sync else mx.async_eval
    out = []
    for first in range(0, count, batch):
        if first and deadline and time.time() > deadline:
            break
        n = min(batch, count - first)
        starts = rng.integers(0, corpus.size - prompt, size=n)
        tokens = mx.array(np.stack([corpus[s:s + prompt] for s in starts]))
        sampled = mx.array([is_sampled(i, fraction) for i in range(first, first + n)])

        def pick(logits):
            greedy = mx.argmax(logits, axis=-1)
            drawn = mx.random.categorical(logits.astype(mx.float32) / SAMPLING_TEMPERATURE)
            return mx.where(sampled, drawn, greedy)

        began = time.time()
        cache = model.make_cache()
        step = pick(model(tokens, cache=cache)[:, -1])
        schedule(step)
        generated = [step]
        for _ in range(generate - 1):
            step = pick(model(step[:, None], cache=cache)[:, -1])
            schedule(step)
            generated.append(step)
        out.append(np.concatenate([np.array(tokens), np.array(mx.stack(generated, axis=1))], axis=1))
        if first == 0 or (first // batch) % 16 == 0:
            print(f"distill: batch of {n} in {time.time() - began:.2f} s "
                  f"({n / (time.time() - began):.1f} sequences/s)", flush=True)
    return np.concatenate(out).astype(np.int32)


def tap_states(model, sequences: np.ndarray, batch: int, tap_layers: list[int]) -> tuple[mx.array, mx.array]:
    """The target's taps over the sequences, and its greedy label for every
    position p >= 1 (its argmax after the tokens before p); position 0 keeps
    its token."""
    # Each batch goes into one host buffer (bf16 bits as uint16: numpy has
    # no bfloat16), copied to the device once at the end, so neither memory
    # ever holds the taps twice: keeping the batches on the device and
    # concatenating them (twice the taps at the peak) ran three trainers on
    # one H100 out of memory.
    host, labels = None, np.empty(sequences.shape, np.int32)
    began = time.time()
    for first in range(0, len(sequences), batch):
        tokens = mx.array(sequences[first:first + batch])
        logits, t = common.forward_with_taps(model, tokens, tap_layers)
        label = mx.concatenate([tokens[:, :1], mx.argmax(logits[:, :-1], axis=-1)], axis=1)
        if host is None:
            host = np.empty((len(sequences),) + t.shape[1:], np.uint16)
        host[first:first + batch] = np.array(t.astype(mx.bfloat16).view(mx.uint16))
        labels[first:first + batch] = np.array(label)
        if first == 0:  # kernel builds (NVRTC) land here: see training/h200.sh
            print(f"first tap batch in {time.time() - began:.1f} s", flush=True)
    mx.clear_cache()
    return mx.array(host).view(mx.bfloat16), mx.array(labels)


def load_grown(draft, path: Path) -> int:
    """Load a trained drafter's weights into `draft`, which may have more
    layers than it (--layers above the init's): the layers it lacks keep
    their random weights except the two projections that write into the
    residual stream (attention's o_proj, the MLP's down_proj), set to zero,
    so each added layer passes its input through unchanged and the grown
    drafter starts as the trained one, every logit the same. Returns the
    number of layers added."""
    weights = mx.load(str(path))
    have = len({k.split(".")[1] for k in weights if k.startswith("layers.")})
    added = len(draft.layers) - have
    if added < 0:
        sys.exit(f"--init {path.parent} has {have} layers, more than --layers {len(draft.layers)}")
    for layer in draft.layers[have:]:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    own = dict(tree_flatten(draft.parameters()))
    wrong = [k for k, v in weights.items() if k not in own or own[k].shape != v.shape]
    if wrong:
        sys.exit(f"--init {path.parent} does not fit this drafter's shape: {wrong[0]}")
    draft.load_weights(list(weights.items()), strict=added == 0)
    return added


def rope(x: mx.array, positions: mx.array, theta: float) -> mx.array:
    """Non-traditional RoPE (rotate halves) over the full head dim, at any
    positions: x [B, heads, L, D], positions [B, L]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-mx.arange(half, dtype=mx.float32) / half)
    angles = positions[:, None, :, None].astype(mx.float32) * freqs
    cos, sin = mx.cos(angles), mx.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def block_logits(draft, embed, head, tokens, taps, anchors, mask_id, theta):
    """The drafter's logits for blocks at `anchors` ([B, K]) of `tokens`
    ([B, N]) given the target taps ([B, N, n*H]), all blocks in one pass:
    [B, K, bs, V]. Equal to z-lab's inference forward of each block alone."""
    B, N = tokens.shape
    K = anchors.shape[1]
    bs = common.BLOCK_SIZE
    offsets = mx.arange(bs)
    positions = (anchors[:, :, None] + offsets).reshape(B, K * bs)
    first = mx.take_along_axis(tokens, anchors, axis=1)
    block = mx.where(offsets == 0, first[:, :, None], mask_id).reshape(B, K * bs)
    h = embed(block)
    ctx = draft.hidden_norm(draft.fc(taps.astype(h.dtype)))
    ctx_positions = mx.broadcast_to(mx.arange(N)[None], (B, N))
    # A block sees the context before its anchor and its own block.
    query_anchor = mx.repeat(anchors, bs, axis=1)[:, :, None]
    sees_ctx = mx.arange(N)[None, None, :] < query_anchor
    query_block = mx.repeat(mx.arange(K), bs)[:, None]
    sees_block = mx.broadcast_to(query_block == query_block.T, (B, K * bs, K * bs))
    mask = mx.concatenate([sees_ctx, sees_block], axis=-1)[:, None]
    for layer in draft.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)

        def heads(proj, norm, source, n):
            y = proj(source).reshape(B, source.shape[1], n, -1)
            return (norm(y) if norm is not None else y).transpose(0, 2, 1, 3)

        q = rope(heads(attn.q_proj, attn.q_norm, x, attn.n_heads), positions, theta)
        kb = rope(heads(attn.k_proj, attn.k_norm, x, attn.n_kv_heads), positions, theta)
        vb = heads(attn.v_proj, None, x, attn.n_kv_heads)
        kc = rope(heads(attn.k_proj, attn.k_norm, ctx, attn.n_kv_heads), ctx_positions, theta)
        vc = heads(attn.v_proj, None, ctx, attn.n_kv_heads)
        keys = mx.concatenate([kc, kb], axis=2)
        values = mx.concatenate([vc, vb], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale, mask=mask)
        h = h + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, K * bs, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head(draft.norm(h)).reshape(B, K, bs, -1)


def block_labels(tokens: mx.array, anchors: mx.array) -> mx.array:
    index = anchors[:, :, None] + mx.arange(common.BLOCK_SIZE)
    return mx.take_along_axis(tokens, index.reshape(tokens.shape[0], -1), axis=1).reshape(index.shape)


def sample_anchors(rng, count: int, batch: int, low: int, high: int) -> mx.array:
    """Per sequence, `count` distinct anchors in [low, high]."""
    return mx.array(np.stack([np.sort(rng.choice(np.arange(low, high + 1), count, replace=False))
                              for _ in range(batch)]).astype(np.int32))


def forward_ms(draft, embed, head, taps: mx.array, context: int, mask_id: int, repeats: int = 20) -> float:
    """Milliseconds of one inference forward of the drafter on this device,
    the way the engine runs it each round: a block of 16 over a context of
    `context` tapped positions, from a fresh cache."""
    timed = copy.deepcopy(draft)
    timed.embed_tokens, timed.lm_head = embed, head
    block = mx.array([[5] + [mask_id] * (common.BLOCK_SIZE - 1)])
    ctx = taps[:1, :context]

    def once():
        return timed(block, ctx, timed.make_cache(), logits_start=1)

    for _ in range(3):
        mx.eval(once())
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(once())
    return (time.perf_counter() - start) / repeats * 1e3


def accept_lengths(logits: mx.array, labels: mx.array) -> mx.array:
    """Greedy DFlash acceptance per block: leading drafts equal to the
    target's tokens, plus the target's own token."""
    hits = (mx.argmax(logits[:, :, 1:], axis=-1) == labels[:, :, 1:]).astype(mx.int32)
    return mx.sum(mx.cumprod(hits, axis=-1), axis=-1) + 1


# The settings that define a distilled sequence; a cache made with others is
# not read (the batch and the sync mode are recorded, not compared: they only
# change how the same distribution is generated).
DEFINING = ("seed", "prompt", "generate", "sampled_fraction", "temperature", "smoke", "target")


def load_sequences(args, target, stream, rng, target_dir: Path, deadline: float) -> np.ndarray:
    """The distilled sequences. A trainer reads every cache in OUT made with
    the same defining settings: sequences.npz (one process's distillation,
    streams from --seed), then sequences-shard-K.npz in order of K (shard K
    draws from its own streams [seed, K], so shards never repeat each other or
    the unsharded cache, and a later call can add shards). With nothing
    cached it distills (until --sequences or the deadline) into
    sequences.npz. `--distill-only --shard K` writes shard K."""
    meta = {"seed": args.seed, "prompt": args.prompt, "generate": args.generate,
            "sampled_fraction": args.sampled_fraction, "distill_batch": args.distill_batch,
            "sync": args.distill_sync, "temperature": SAMPLING_TEMPERATURE, "smoke": args.smoke,
            "target": common.sha256(next(iter(sorted(target_dir.glob("model*.safetensors")))))}
    if args.shard is None:
        parts = [(path, read_cache(path, meta, args.sequences, whole=True)) for path in cache_files(args.out)]
        parts = [(path, part) for path, part in parts if part is not None]
        if parts:
            for path, part in parts:
                print(f"{path.name}: {len(part)} sequences", flush=True)
            args.sources = {path.name: len(part) for path, part in parts}
            sequences = np.concatenate([part for _, part in parts])
            repeats = len(sequences) - len(np.unique(sequences[:, :args.prompt], axis=0))
            # Windows drawn at random repeat by chance (n^2 / 2 / corpus size: ~1,000
            # in 100,000 windows of a 5 M-token corpus); two caches from one stream
            # repeat every row of the shorter one.
            if repeats > len(sequences) // 10:
                sys.exit(f"{repeats} of the {len(sequences)} cached prompts repeat: "
                         f"two caches were drawn from the same stream")
            return sequences
        cache = args.out / "sequences.npz"
    else:
        meta["shard"] = args.shard
        cache = args.out / f"sequences-shard-{args.shard}.npz"
        rng = np.random.default_rng(shard_entropy(args.seed, args.shard))
        mx.random.seed(args.seed * 1000 + 1 + args.shard)
    cached = read_cache(cache, meta, args.sequences)
    if cached is not None:
        args.sources = {cache.name: len(cached)}
        return cached
    began = time.time()
    sequences = distill(target, stream, args.sequences, args.prompt, args.generate,
                        args.distill_batch, rng, args.sampled_fraction, deadline, args.distill_sync)
    print(f"distilled {len(sequences)} sequences at batch {args.distill_batch} in "
          f"{time.time() - began:.1f} s", flush=True)
    meta["cut_by_deadline"] = len(sequences) < args.sequences
    np.savez(cache, sequences=sequences, meta=json.dumps(meta))
    args.sources = {cache.name: len(sequences)}
    return sequences


def shard_entropy(seed: int, shard: int) -> list[int]:
    """Shard K's window stream. Not [seed, K]: numpy's SeedSequence drops
    trailing zero words, so [seed, 0] would repeat the unsharded stream of
    `seed`; the middle word keeps every shard's entropy distinct."""
    return [seed, 0x5EED, shard]


def cache_files(out: Path) -> list[Path]:
    """sequences.npz, then the shards in order of their number."""
    shards = sorted(out.glob("sequences-shard-*.npz"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return [p for p in [out / "sequences.npz"] if p.exists()] + shards


def read_cache(path: Path, meta: dict, count: int, whole: bool = False) -> np.ndarray | None:
    """The first `count` sequences of a distillation cache made with the
    defining settings of `meta`, or None. A cache holding fewer is read whole
    if its deadline cut it short or `whole` (a trainer reading every cache),
    else it is None (a distillation asked for more)."""
    if not path.exists():
        return None
    saved = np.load(path, allow_pickle=False)
    made = json.loads(str(saved["meta"]))
    cut = made.get("cut_by_deadline", False)
    same = all(made.get(key) == meta.get(key) for key in DEFINING)
    if not same or not (cut or whole or len(saved["sequences"]) >= count):
        return None
    if len(saved["sequences"]) < count and not whole:
        print(f"using the {len(saved['sequences'])} sequences of {path.name} "
              f"(the distillation stopped at its deadline)", flush=True)
    return saved["sequences"][:count]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--target", type=Path, help="the target checkpoint (default: OUT/target-raw, "
                        "else models/default/target)")
    parser.add_argument("--layers", type=int, default=common.DRAFTER["num_hidden_layers"])
    parser.add_argument("--taps", default=",".join(map(str, common.TAP_LAYERS)),
                        help="the target layers the drafter reads, comma-separated")
    parser.add_argument("--tag", default="", help="write OUT/drafter-TAG and OUT/train_drafter-TAG.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequences", type=int, default=8192,
                        help="sequences to distill; a trainer reads at most this many of each cache")
    parser.add_argument("--sampled-fraction", type=float, default=0.125,
                        help="share of the sequences generated at temperature 0.7 instead of greedy")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--generate", type=int, default=192)
    parser.add_argument("--distill-batch", type=int, default=512)
    parser.add_argument("--distill-sync", action="store_true",
                        help="evaluate each generation step before the next (no async_eval)")
    parser.add_argument("--shard", type=int,
                        help="with --distill-only: write OUT/sequences-shard-K.npz (its own random streams)")
    parser.add_argument("--distill-only", action="store_true",
                        help="write OUT/sequences.npz (or a shard) and stop")
    parser.add_argument("--corpus-only", action="store_true",
                        help="write OUT/corpus.npz (the distillation's prompts) and stop")
    parser.add_argument("--steps", type=int, default=0, help="0: as many as fit --max-minutes")
    parser.add_argument("--stop-at-step", type=int, default=0,
                        help="stop after this step of a --steps schedule (repeats a run a deadline cut)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=4.0)
    parser.add_argument("--max-minutes", type=float, default=7.0,
                        help="how long training may run, without --deadline")
    parser.add_argument("--deadline", type=float, default=0.0,
                        help="unix time by which training stops (for runs that share a machine call)")
    parser.add_argument("--init", type=Path,
                        help="start from this drafter folder's weights (a fine-tune), not random ones")
    parser.add_argument("--tap-batch", type=int, default=64,
                        help="sequences per target forward when computing the taps (larger on a GPU)")
    parser.add_argument("--side-by-side", metavar="DIR:N",
                        help="one of N trainers sharing the GPU: time the steps when all N are "
                             "ready (each marks itself in DIR), so the plan fits the shared speed")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--teacher-forced", action="store_true",
                        help="label corpus windows with the target's greedy choices instead of "
                             "generating (for machines where generation is too slow)")
    args = parser.parse_args()
    if args.side_by_side:
        # MLX keeps freed buffers for reuse up to the device's whole memory by
        # default; three trainers each doing so filled an H100 (77-81 GB of 80).
        mx.set_cache_limit(8 << 30)
    if args.smoke:
        args.sequences, args.generate, args.batch, args.anchors = 12, 48, 2, 4
        args.distill_batch = 4
        args.steps = args.steps or (0 if args.deadline else 4)  # planned to a deadline, as on the GPU
    taps_ids = [int(t) for t in args.taps.split(",")]
    suffix = f"-{args.tag}" if args.tag else ""
    common.seed_everything(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.time()
    # Training stops here, leaving time to evaluate, save and time the drafter.
    # A --deadline alone decides (the 7-minute default cut a run at 9,789
    # of its 17,464 planned steps, its learning rate not yet decayed).
    stop_at = args.deadline - 40 if args.deadline else started + args.max_minutes * 60
    common.use_chunked_gdn()
    target_dir = args.target or (args.out / "target-raw")
    if not target_dir.exists():
        target_dir = common.ROOT / "models" / "default" / "target"
    target = common.load_target(target_dir)
    target.freeze()
    tokenizer = common.load_tokenizer(target_dir)
    cfg = common.drafter_config(tokenizer, args.layers, taps_ids)
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "corpus.npz").exists():
        # Step 1 ran elsewhere: prompts from this Python's corpus packages.
        common.write_token_stream(tokenizer, args.out / "corpus.npz", 2e6 if args.smoke else 20e6)
    if args.corpus_only:
        return
    corpus = np.load(args.out / "corpus.npz")
    stream = np.concatenate([corpus["train"], corpus["valid"]])
    if args.teacher_forced:
        # Corpus windows, labelled with the target's greedy choice after each
        # true prefix: one forward instead of a generation per sequence.
        length = args.prompt + args.generate
        starts = rng.integers(0, stream.size - length, size=args.sequences)
        sequences = np.stack([stream[s:s + length] for s in starts]).astype(np.int32)
        args.prompt = 16  # anchors from here on, so every block has context
    else:
        sequences = load_sequences(args, target, stream, rng, target_dir,
                                   args.deadline - 5 if args.deadline and args.distill_only else 0.0)
    print(f"sequences {sequences.shape} in {time.time() - started:.0f} s", flush=True)
    if args.distill_only:
        return
    taps, labels_all = tap_states(target, sequences, args.tap_batch, taps_ids)
    if not args.teacher_forced:
        # How often this forward's greedy choice is the generated token, over
        # the greedy rows: 1.0 for MLX-made rows; below it where another
        # generator (torch_distill.py) left MLX's path at near-ties.
        greedy = np.concatenate([[not is_sampled(i, args.sampled_fraction) for i in range(n)]
                                 for n in args.sources.values()])
        agree = np.array(labels_all[:, args.prompt:])[greedy] == sequences[:, args.prompt:][greedy]
        args.generator_agreement = round(float(agree.mean()), 4)
        print(f"generator agreement {args.generator_agreement}", flush=True)
        if args.generator_agreement < MIN_AGREEMENT:
            sys.exit(f"the sequences agree with this target's greedy choice at only "
                     f"{args.generator_agreement:.1%} of positions: wrong target or generator")
        labels_all = mx.array(sequences)  # the generated part is the target's own path
    mx.eval(taps, labels_all)  # the concatenation too, so the first step's time is its own
    print(f"taps {taps.shape} in {time.time() - started:.0f} s", flush=True)
    # The first 5% are held out, at most HELD_OUT rows (an evaluation's cost).
    held = min(HELD_OUT, max(2, len(sequences) // 20))
    tokens_all = mx.array(sequences)

    inner = target.language_model.model
    embed, head = inner.embed_tokens, inner.embed_tokens.as_linear
    mask_id, theta = cfg["dflash_config"]["mask_token_id"], cfg["rope_theta"]
    weights = mx.exp(-mx.arange(common.BLOCK_SIZE - 1, dtype=mx.float32) / args.gamma)
    low, high = args.prompt - 1, sequences.shape[1] - common.BLOCK_SIZE
    # The longest context a training block sees: the drafter attends to no
    # more at inference (its drafts fall apart past the lengths it was
    # trained on: docs/acceptance.md, "Long contexts").
    cfg["dflash_config"]["context_window"] = int(high)

    def loss_fn(model, tokens, labels, tap, anchors):
        logits = block_logits(model, embed, head, tokens, tap, anchors, mask_id, theta)
        labels = block_labels(labels, anchors)
        ce = nn.losses.cross_entropy(logits[:, :, 1:].astype(mx.float32), labels[:, :, 1:])
        return mx.sum(ce * weights) / (ce.shape[0] * ce.shape[1] * mx.sum(weights))

    def make_trainer(steps: int):
        """A fresh drafter and its compiled step: warm-up of 100 steps, then
        cosine decay to lr/10 at `steps`."""
        draft = zlab.DFlashDraftModel(zlab_config(cfg))
        if args.init:
            # Saved in bf16; trained in f32 like a fresh drafter.
            load_grown(draft, args.init / "model.safetensors")
            draft.set_dtype(mx.float32)
        mx.eval(draft.parameters())
        warmup = max(1, min(100, steps // 2))
        schedule = optim.join_schedules(
            [optim.linear_schedule(args.lr / 100, args.lr, warmup),
             optim.cosine_decay(args.lr, max(1, steps - warmup), args.lr / 10)], [warmup])
        optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
        state = [draft.state, optimizer.state]

        def compiled(tokens, labels, tap, anchors):
            loss, grads = nn.value_and_grad(draft, loss_fn)(draft, tokens, labels, tap, anchors)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(draft, grads)
            return loss

        if args.compile:
            compiled = mx.compile(compiled, inputs=state, outputs=state)

        def step(rng):
            rows = mx.array(rng.integers(held, len(sequences), size=args.batch))
            anchors = sample_anchors(rng, args.anchors, args.batch, low, high)
            loss = compiled(tokens_all[rows], labels_all[rows], taps[rows], anchors)
            mx.eval(state, loss)
            return loss

        return draft, step

    if args.steps == 0:  # as many as fit the time left, measured on a throwaway drafter
        _, probe = make_trainer(100)
        probe_rng = np.random.default_rng(args.seed + 1)
        peers = None
        if args.side_by_side:
            folder, count = args.side_by_side.rsplit(":", 1)

            def peers():
                if not common.wait_for_peers(Path(folder), args.tag or "drafter", int(count)):
                    print("side by side: the other trainers never came; timing alone", flush=True)
        args.steps = common.plan_steps(lambda: probe(probe_rng), stop_at - time.time() - 20,
                                       before_timing=peers)
    mx.random.seed(args.seed)
    draft, step = make_trainer(args.steps)

    def evaluate(draft) -> dict:
        """Held-out greedy sequences, a block every 8 positions: the mean
        accept length, the share of blocks whose accepted run reaches each
        block position, and the cross-entropy at each position."""
        lengths, losses = [], []
        for first in range(0, held, 16):
            rows = mx.arange(first, min(first + 16, held))
            tokens, labels, tap = tokens_all[rows], labels_all[rows], taps[rows]
            anchors = mx.broadcast_to(mx.arange(low, high + 1, 8)[None], (rows.size, len(range(low, high + 1, 8))))
            logits = block_logits(draft, embed, head, tokens, tap, anchors, mask_id, theta)
            wanted = block_labels(labels, anchors)
            lengths.append(accept_lengths(logits, wanted).reshape(-1))
            ce = nn.losses.cross_entropy(logits[:, :, 1:].astype(mx.float32), wanted[:, :, 1:])
            losses.append(ce.reshape(-1, common.BLOCK_SIZE - 1))
        lengths = mx.concatenate(lengths).astype(mx.float32)
        reach = [float(mx.mean(lengths > k).item()) for k in range(1, common.BLOCK_SIZE)]
        loss_by_position = mx.mean(mx.concatenate(losses), axis=0).tolist()
        return {"accept_len": float(mx.mean(lengths).item()),
                "reach_by_position": [round(r, 4) for r in reach],
                "loss_by_position": [round(v, 4) for v in loss_by_position]}

    init = None
    if args.init:
        # The starting drafter on this run's held-out rows, as it was saved (bf16).
        start = copy.deepcopy(draft)
        start.set_dtype(mx.bfloat16)
        init = {"path": str(args.init), "sha256": common.sha256(args.init / "model.safetensors"),
                "offline_accept_len_bf16": evaluate(start)["accept_len"]}
        manifest = args.init.parent / "manifest.json"
        if manifest.exists():
            report = json.loads(manifest.read_text()).get("training", {}).get("train_drafter")
            if report:
                init["report"] = {k: v for k, v in report.items() if k != "log"}
        print(f"starting drafter: held-out accept length {init['offline_accept_len_bf16']:.2f}", flush=True)
        del start
    log, t0, done = [], time.time(), 0
    for done in range(1, args.steps + 1):
        loss = step(rng)
        if done % 200 == 0 or done == args.steps or done <= 2:
            entry = {"step": done, "loss": loss.item(), "seconds": round(time.time() - t0, 1)}
            if done % 2000 == 0 or done == args.steps:
                entry["accept_len"] = evaluate(draft)["accept_len"]
            log.append(entry)
            print(json.dumps(entry), flush=True)
        if done == args.stop_at_step:
            print(f"stopping at step {done}: --stop-at-step", flush=True)
            break
        if time.time() > stop_at:
            print(f"stopping at step {done}: time limit", flush=True)
            break
    draft.set_dtype(mx.bfloat16)
    held_out = evaluate(draft)
    save_drafter(args.out / f"drafter{suffix}", cfg, draft, dtype=mx.bfloat16)
    milliseconds = forward_ms(draft, embed, head, taps, 256, mask_id)
    # The loss curve in a few points (the whole log stays in the report).
    marks = sorted({log[round(f * (len(log) - 1))]["step"] for f in (0, 0.1, 0.25, 0.5, 0.75, 1)})
    target_name = (str(target_dir.resolve().relative_to(common.ROOT))
                   if target_dir.resolve().is_relative_to(common.ROOT) else str(target_dir))
    report = {"seed": args.seed, "target": target_name, "layers": args.layers, "taps": taps_ids,
              "sequences": int(len(sequences)), "held_out": held,
              "sequence_files": getattr(args, "sources", None),
              "generator_agreement": getattr(args, "generator_agreement", None),
              "sampled_fraction": args.sampled_fraction, "sampling_temperature": SAMPLING_TEMPERATURE,
              "prompt": args.prompt, "generate": args.generate,
              "teacher_forced": args.teacher_forced, "steps_planned": args.steps,
              "steps_done": done, "batch": args.batch, "anchors": args.anchors, "lr": args.lr,
              "gamma": args.gamma, "parameters": common.count_params(draft),
              "bytes": (args.out / f"drafter{suffix}" / "model.safetensors").stat().st_size,
              "device": str(mx.default_device()), "forward_ms_ctx256": round(milliseconds, 3),
              "offline_accept_len_bf16": held_out["accept_len"],
              "reach_by_position": held_out["reach_by_position"],
              "loss_by_position": held_out["loss_by_position"],
              "loss_curve": {str(e["step"]): round(e["loss"], 4) for e in log if e["step"] in marks},
              "init": init, "seconds": round(time.time() - started, 1), "log": log}
    (args.out / f"train_drafter{suffix}.json").write_text(json.dumps(report, indent=2))
    print(f"held-out greedy accept length (bf16, block 16): {held_out['accept_len']:.2f}; "
          f"forward {milliseconds:.2f} ms; {time.time() - started:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
