"""The training code's two pieces of maths, checked against the references
they must equal: the chunked gated delta rule against mlx-lm's per-token
recurrence, and the drafter's all-blocks-at-once training forward against
z-lab's inference forward of one block."""

import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "training"))

import common  # noqa: E402
from gdn_chunked import chunked_gated_delta  # noqa: E402
from mlx_lm.models.gated_delta import gated_delta_ops, normalize_qk  # noqa: E402


@pytest.mark.parametrize("shape", [(2, 100, 2, 4, 16, 16), (1, 64, 2, 2, 32, 8), (1, 7, 1, 2, 16, 16)])
def test_chunked_gdn_matches_the_recurrence(shape):
    B, T, Hk, Hv, Dk, Dv = shape
    mx.random.seed(T)
    q, k = normalize_qk(mx.random.normal((B, T, Hk, Dk)), mx.random.normal((B, T, Hk, Dk)),
                        inv_scale=Dk ** -0.5, eps=1e-6)
    v = mx.random.normal((B, T, Hv, Dv))
    g = mx.exp(-mx.random.uniform(0.0, 2.0, (B, T, Hv)))
    beta = mx.sigmoid(mx.random.normal((B, T, Hv)))
    state = 0.1 * mx.random.normal((B, Hv, Dv, Dk))
    y_ref, s_ref = gated_delta_ops(q, k, v, g, beta, state)
    y, s = chunked_gated_delta(q, k, v, g, beta, state, chunk=32)
    assert mx.abs(y - y_ref).max().item() < 1e-5
    assert mx.abs(s - s_ref).max().item() < 1e-5


def test_block_training_forward_equals_zlab_inference():
    from make_drafters import random_drafter, zlab_config
    from train_drafter import block_logits

    from dflash import model_mlx as zlab

    cfg = dict(common.DRAFTER, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=96, vocab_size=300,
               dflash_config={"target_layer_ids": [0, 2, 4], "mask_token_id": 3})
    draft = random_drafter(cfg, seed=5)
    mx.random.seed(1)
    embed = nn.Embedding(300, 64)
    N, anchors = 40, [7, 20]
    tokens = mx.random.randint(4, 300, (1, N))
    taps = mx.random.normal((1, N, 3 * 64))
    ours = block_logits(draft, embed, embed.as_linear, tokens, taps, mx.array([anchors]), 3,
                        cfg["rope_theta"])
    reference = zlab.DFlashDraftModel(zlab_config(cfg))
    reference.update(draft.parameters())
    reference.embed_tokens, reference.lm_head = embed, embed.as_linear
    for i, a in enumerate(anchors):
        block = mx.array([[tokens[0, a].item()] + [3] * 15])
        expected = reference(block, taps[:, :a], reference.make_cache(), logits_start=1)
        assert mx.abs(ours[0, i, 1:] - expected[0]).max().item() < 1e-4


def test_sampled_rows_are_interleaved_so_any_prefix_keeps_the_share():
    from train_drafter import is_sampled

    rows = [is_sampled(i, 0.125) for i in range(64)]
    assert sum(rows) == 8
    assert [i for i, s in enumerate(rows) if s] == list(range(7, 64, 8))
    assert not any(is_sampled(i, 0.0) for i in range(64))


def test_distillation_is_greedy_and_a_deadline_cut_is_a_prefix():
    """The pipelined generation (async_eval) writes the target's greedy path,
    the same as evaluating each step before the next, and a shorter run (a
    deadline) gives the first rows of the longer one."""
    import numpy as np
    from train_drafter import distill

    model = tiny_target()
    corpus = np.random.default_rng(0).integers(4, 300, 5000).astype(np.int32)

    def run(count):
        mx.random.seed(9)
        return distill(model, corpus, count, 8, 6, 2, np.random.default_rng(1), 0.0)

    four, two = run(4), run(2)
    assert four.shape == (4, 14)
    assert (four[:2] == two).all()
    for row in four:
        tokens = [int(t) for t in row[:8]]
        cache = model.make_cache()
        logits = model(mx.array([tokens]), cache=cache)
        for _ in range(6):
            tokens.append(mx.argmax(logits[0, -1]).item())
            logits = model(mx.array([[tokens[-1]]]), cache=cache)
        assert tokens == list(row)


def test_every_distillation_cache_is_read_and_shards_never_repeat_a_stream(tmp_path):
    import json

    import numpy as np
    from train_drafter import DEFINING, cache_files, read_cache, shard_entropy

    def windows(entropy):
        return np.random.default_rng(entropy).integers(0, 1 << 30, 64)

    # numpy's SeedSequence drops trailing zero words: [seed, 0] is seed's own stream.
    assert (windows([0, 0]) == windows(0)).all()
    streams = [windows(0)] + [windows(shard_entropy(0, k)) for k in range(4)]
    assert len({tuple(s) for s in streams}) == len(streams)

    meta = {key: 1 for key in DEFINING}
    for name, rows, cut in [("sequences.npz", 5, True), ("sequences-shard-10.npz", 3, False),
                            ("sequences-shard-2.npz", 4, False)]:
        made = dict(meta, distill_batch=rows, cut_by_deadline=cut)  # batch: recorded, not compared
        np.savez(tmp_path / name, sequences=np.full((rows, 8), rows, np.int32), meta=json.dumps(made))
    np.savez(tmp_path / "sequences-shard-3.npz", sequences=np.zeros((9, 8), np.int32),
             meta=json.dumps(dict(meta, seed=2)))  # another seed: never read
    paths = cache_files(tmp_path)
    assert [p.name for p in paths] == ["sequences.npz", "sequences-shard-2.npz",
                                       "sequences-shard-3.npz", "sequences-shard-10.npz"]
    read = [read_cache(p, dict(meta, distill_batch=32), 100, whole=True) for p in paths]
    assert [None if r is None else len(r) for r in read] == [5, 4, None, 3]
    # A distillation asking for more than a complete cache holds makes more.
    assert read_cache(paths[1], meta, 100) is None
    assert len(read_cache(paths[0], meta, 100)) == 5  # cut by its deadline: all it has
    assert len(read_cache(paths[1], meta, 2)) == 2


def tiny_target():
    config = common.hf_config()
    config["text_config"] = dict(config["text_config"], hidden_size=64, intermediate_size=96,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                 linear_num_value_heads=2, linear_num_key_heads=1,
                                 linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=300)
    mx.random.seed(3)
    model = common.build_target(config)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("quantized", [False, True])
def test_torch_generator_follows_the_mlx_target(quantized):
    """training/torch_distill.py (the GPU's large-batch generator) mirrors
    mlx-lm's forward: on an f32 target its logits agree to float rounding
    and its greedy rows are mlx-lm's greedy rows, token for token; sampled
    rows stay within the prompt's vocabulary."""
    torch = pytest.importorskip("torch")  # on the GPU machine; not in CI's environment
    import numpy as np
    from torch_distill import TorchTarget, generate
    from train_drafter import distill

    model = tiny_target()
    if quantized:
        nn.quantize(model, group_size=32, bits=8)
        mx.eval(model.parameters())
    corpus = np.random.default_rng(0).integers(4, 300, 5000).astype(np.int32)
    ours = TorchTarget(model, "cpu")
    rows = distill(model, corpus, 3, 8, 12, 3, np.random.default_rng(1), 0.0, sync=True)
    got = generate(ours, rows[:, :8], 12, np.zeros(3, bool), torch.Generator().manual_seed(0))
    assert (got == rows).all()
    # Logits along the same path, position by position.
    cache = model.make_cache()
    expected = model(mx.array(rows[:, :-1]), cache=cache)
    ours.start(3, 20)
    for pos in range(19):
        logits = ours.step(torch.from_numpy(rows[:, pos].astype(np.int64)), pos).numpy()
        assert np.abs(logits - np.array(expected[:, pos])).max() < 1e-4
    drawn = generate(ours, rows[:, :8], 12, np.ones(3, bool), torch.Generator().manual_seed(0))
    assert drawn.shape == (3, 20) and ((drawn >= 0) & (drawn < 300)).all()
    assert (drawn[:, :8] == rows[:, :8]).all()


def test_line_end_windows_end_where_a_block_opens():
    # The prompts people write end on a line that opens a block; the
    # distillation can draw its windows there (torch_distill.py --prompt-at line).
    import numpy as np

    tokenizer = common.load_tokenizer(ROOT / "models" / "default" / "target")
    text = ("import os\n\n\ndef fib(n):\n    if n < 2:\n        return n\n"
            "    return fib(n - 1)  # for the test\n\n\nclass Stack:\n    \"\"\"A stack.\"\"\"\n"
            "    x = 1\n")
    ids = np.asarray(tokenizer.encode(text).ids)
    ends = common.line_end_windows(ids, tokenizer, 1)
    heads = [tokenizer.decode(ids[:end].tolist()) for end in ends]
    opened = [head.rstrip(" ").rsplit("\n", 2)[-2].strip() for head in heads]
    assert opened == ["def fib(n):", "if n < 2:", "class Stack:", '"""A stack."""'], heads
    # A window must fit before its end: none ends inside the first 10 tokens.
    assert all(end >= 10 for end in common.line_end_windows(ids, tokenizer, 10))


def test_prose_windows_end_inside_docstrings_and_comments():
    # The prose prompts of bench/acceptance.py end after a word of a
    # docstring or comment, or after a docstring's newline; the
    # distillation can draw its windows there (torch_distill.py --prompt-at prose).
    import numpy as np

    tokenizer = common.load_tokenizer(ROOT / "models" / "default" / "target")
    text = ("def fib(n):\n    \"\"\"Return the nth number.\n\n    It's slow.\n    \"\"\"\n"
            "    x = 'a' + \"b\"  # add them up\n    return x\n")
    ids = np.asarray(tokenizer.encode(text).ids)
    ends = common.prose_windows(ids, tokenizer, 1)
    heads = [tokenizer.decode(ids[:end].tolist()) for end in ends]
    assert heads, "no prose window"
    for head in heads:
        rest = head[len("def fib(n):\n"):]
        in_doc = rest.count('\"\"\"') == 1
        comment = head.rsplit("\n", 1)[-1].lstrip().startswith("x = 'a' + \"b\"  #")
        assert in_doc or comment, head
    # Every word of the docstring's first line ends a window, and of the comment.
    assert any(h.endswith("Return the") for h in heads), heads
    assert any(h.endswith("# add them") for h in heads), heads
    # Only after whole words: not inside `nth` (tokens ` n`, `th`).
    assert not any(h.endswith("the n") for h in heads), heads
    # Code outside them never does: not after `fib`, `x`, `return`.
    assert not any(h.endswith(("fib", "return x", "= 'a'")) for h in heads), heads
    # A window must fit before its end.
    assert all(end >= 10 for end in common.prose_windows(ids, tokenizer, 10))


def test_tap_states_equal_one_forward_over_all_sequences():
    """tap_states stages each batch in host memory (bf16 bits as uint16) and
    copies the whole set back once; the result must be the forward's own
    taps, bit for bit, and its greedy labels, whatever the batch split."""
    import numpy as np
    from train_drafter import tap_states

    model = tiny_target()
    rows = np.random.default_rng(2).integers(4, 300, (5, 12)).astype(np.int32)
    taps, labels = tap_states(model, rows, 2, [0, 1])
    logits, expected = common.forward_with_taps(model, mx.array(rows), [0, 1])
    assert taps.dtype == mx.bfloat16 and labels.dtype == mx.int32
    assert mx.array_equal(taps, expected.astype(mx.bfloat16)).item()
    assert (np.array(labels[:, 0]) == rows[:, 0]).all()
    assert (np.array(labels[:, 1:]) == np.array(mx.argmax(logits[:, :-1], axis=-1))).all()


def test_a_grown_drafter_starts_as_the_drafter_it_grew_from(tmp_path):
    """--init with more --layers than the init: the added layers pass their
    input through, so every logit of the grown drafter equals the trained
    one's before the first step; a drafter of another width is refused."""
    from make_drafters import random_drafter, save_drafter, zlab_config
    from train_drafter import block_logits, load_grown

    from dflash import model_mlx as zlab

    cfg = dict(common.DRAFTER, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=96, vocab_size=300, num_hidden_layers=2,
               dflash_config={"target_layer_ids": [0, 2, 4], "mask_token_id": 3})
    small = random_drafter(cfg, seed=7)
    save_drafter(tmp_path / "small", cfg, small)
    grown = zlab.DFlashDraftModel(zlab_config(dict(cfg, num_hidden_layers=4)))
    assert load_grown(grown, tmp_path / "small" / "model.safetensors") == 2
    mx.random.seed(1)
    embed = nn.Embedding(300, 64)
    tokens, taps = mx.random.randint(4, 300, (1, 40)), mx.random.normal((1, 40, 3 * 64))
    anchors = mx.array([[7, 20]])
    a = block_logits(small, embed, embed.as_linear, tokens, taps, anchors, 3, cfg["rope_theta"])
    b = block_logits(grown, embed, embed.as_linear, tokens, taps, anchors, 3, cfg["rope_theta"])
    assert mx.array_equal(a, b).item()
    # a layer's weights that are not zero would change them
    assert not mx.array_equal(grown.layers[3].mlp.up_proj.weight, 0).item()
    wide = zlab.DFlashDraftModel(zlab_config(dict(cfg, hidden_size=128, num_hidden_layers=3)))
    with pytest.raises(SystemExit, match="does not fit"):
        load_grown(wide, tmp_path / "small" / "model.safetensors")


def test_trainers_side_by_side_time_their_steps_together(tmp_path):
    """wait_for_peers returns once every trainer has marked itself ready,
    whatever order they come in, and gives up (False) on a trainer that
    never comes; plan_steps runs the wait between warm-up and timing."""
    import threading

    results = {}

    def trainer(name):
        results[name] = common.wait_for_peers(tmp_path / "three", name, 3, timeout=60)

    threads = [threading.Thread(target=trainer, args=(n,)) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": True, "b": True, "c": True}
    assert common.wait_for_peers(tmp_path / "alone", "a", 2, timeout=0.2) is False
    calls = []
    common.plan_steps(lambda: calls.append("step"), 1e6, before_timing=lambda: calls.append("wait"))
    assert calls == ["step"] * 3 + ["wait"] + ["step"] * 10


def test_grow_writes_the_committed_drafter_deeper(tmp_path, monkeypatch):
    """training/grow.py: the committed drafter with two identity layers
    added, its config saying so, its first layers' weights the committed
    ones bit for bit and the added layers' output projections zero."""
    import grow

    src = ROOT / "models" / "default" / "drafter"
    monkeypatch.setattr(sys, "argv", ["grow.py", str(src), "4", str(tmp_path / "l4")])
    grow.main()
    import json

    cfg = json.loads((tmp_path / "l4" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 4
    old, new = mx.load(str(src / "model.safetensors")), mx.load(str(tmp_path / "l4" / "model.safetensors"))
    assert all(mx.array_equal(old[k], new[k]).item() for k in old)
    for i in (2, 3):
        assert not mx.any(new[f"layers.{i}.self_attn.o_proj.weight"]).item()
        assert not mx.any(new[f"layers.{i}.mlp.down_proj.weight"]).item()
        assert mx.any(new[f"layers.{i}.mlp.up_proj.weight"]).item()
