"""The GPU benchmarks' checkpoints at small sizes: bench/vs_mlx_lm.py writes
the 35B-A3B's MoE layout as mlx-lm converts it and counts only the experts a
token meets as read; bench/dflash_round.py's drafter taps the target where
the published Qwen3.5-9B drafter does."""

import json
import sys
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import dflash_round  # noqa: E402  (needs the path above)
import vs_mlx_lm  # noqa: E402


def small(shape: str, **sizes) -> dict:
    out = dict(vs_mlx_lm.SHAPES[shape])
    out.update(hidden_size=128, num_hidden_layers=4, head_dim=64, linear_key_head_dim=32,
               linear_value_head_dim=32, vocab_size=1024, **sizes)
    return out


def test_the_moe_checkpoint_reads_top_k_of_its_experts_a_token(tmp_path):
    path = tmp_path / "moe"
    vs_mlx_lm.write_checkpoint(path, small("qwen3.6-35b-a3b", num_experts=16,
                                           moe_intermediate_size=64,
                                           shared_expert_intermediate_size=64))
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_moe"
    eight_bit = {k for k, v in config["quantization"].items() if isinstance(v, dict)}
    assert "language_model.model.layers.0.mlp.gate" in eight_bit
    assert "language_model.model.layers.0.mlp.shared_expert_gate" in eight_bit
    embedding = experts = 0
    for f in path.glob("model*.safetensors"):
        for name, array in mx.load(str(f)).items():
            embedding += array.nbytes if "embed_tokens" in name else 0
            experts += array.nbytes if "switch_mlp" in name else 0
    assert experts > 0
    total = vs_mlx_lm.weight_bytes(path)
    # 8 of 16 experts a token: half of the experts' bytes are skipped.
    assert vs_mlx_lm.bytes_read_per_token(path) == int(total - embedding - experts / 2)


def test_a_dense_checkpoint_reads_every_weight_but_the_embedding(tmp_path):
    path = tmp_path / "dense"
    vs_mlx_lm.write_checkpoint(path, small("qwen3.5-9b", intermediate_size=256))
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3_5"
    embedding = sum(a.nbytes for f in path.glob("model*.safetensors")
                    for n, a in mx.load(str(f)).items() if "embed_tokens" in n)
    assert vs_mlx_lm.bytes_read_per_token(path) == vs_mlx_lm.weight_bytes(path) - embedding


def test_an_exact_prompt_has_the_tokens_asked_for(tmp_path):
    path = tmp_path / "dense"
    vs_mlx_lm.write_checkpoint(path, small("qwen3.5-9b", intermediate_size=256))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    for tokens in (24, 200):
        text = vs_mlx_lm.prompt_text(tokens, path)
        assert abs(len(tokenizer.encode(text, add_special_tokens=False).ids) - tokens) <= 1


def test_the_round_benchmark_drafter_taps_a_9b_target_as_the_published_drafter(tmp_path):
    path = tmp_path / "t"
    path.mkdir()
    text = dict(vs_mlx_lm.SHAPES["qwen3.5-9b"])
    (path / "config.json").write_text(json.dumps({"text_config": text}))
    cfg = dflash_round.drafter_config(path)
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 8, 15, 22, 29]
    assert cfg["num_hidden_layers"] == 5 and cfg["hidden_size"] == 4096
    assert cfg["num_attention_heads"] * cfg["head_dim"] == 4096
