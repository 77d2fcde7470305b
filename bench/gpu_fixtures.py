"""Writes random (target, drafter) pairs at hidden size 256 for the GPU
lossless check (bench/lossless_check.py --pairs): MLX's CUDA quantized
matmul fails on the test fixtures' hidden size 64 (docs/gpu.md, "Checks").

    python3 bench/gpu_fixtures.py OUT_DIR

OUT_DIR then holds
  dense-mlx-4bit-h256    dense target, mlx-lm 4-bit (groups of 64), one layer's
                         down_proj at 8 bits, as the test fixture dense-mlx-4bit
  moe-mlx-4bit-h256      MoE target (16 experts, 4 a token), 4-bit with the
                         router and shared-expert gates at 8 bits, as mlx-lm
                         converts Qwen3.5/3.6 MoE models
  drafter-dense-h256     drafter-dense-f32's config at this size, for the dense target
  drafter-sliding-h256   drafter-sliding-f32's config at this size, for the MoE target
Targets and drafters are bf16 as published ones are (the targets' A_log
stays f32, as mlx-lm's conversion leaves it), so the CUDA build needs no
f32 quantized matmul. The code is tests/fixtures' (make_fixtures.py,
make_drafters.py) with the sizes below; no reference outputs: the check
compares our DFlash output with our plain decoding. Deterministic in the seeds.
"""

import copy
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map_with_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
import make_drafters  # noqa: E402
import make_fixtures  # noqa: E402

HIDDEN = 256
TEXT_SIZES = {
    "hidden_size": HIDDEN,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "vocab_size": 512,  # the fixture tokenizer's
}
MOE_SIZES = {
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
}
# The drafters' taps (make_drafters: [0, 2, 3] and [1, 3]) stay below 4 layers.
DRAFTER_SIZES = {"hidden_size": HIDDEN, "intermediate_size": 512, "head_dim": 64,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                 "num_target_layers": TEXT_SIZES["num_hidden_layers"]}
EIGHT_BITS = {"group_size": 64, "bits": 8}
TARGETS = {  # name -> (MoE, seed, 8-bit overrides by module path suffix)
    "dense-mlx-4bit-h256": (False, 31, {"layers.0.mlp.down_proj": EIGHT_BITS}),
    "moe-mlx-4bit-h256": (True, 32, {"mlp.gate": EIGHT_BITS, "mlp.shared_expert_gate": EIGHT_BITS}),
}
DRAFTERS = {  # name -> (make_drafters config, seed)
    "drafter-dense-h256": (make_drafters.BASE, 33),
    "drafter-sliding-h256": (make_drafters.SLIDING, 34),
}


def target_config(moe: bool) -> dict:
    config = make_fixtures.hf_config(moe)
    config["text_config"].update(TEXT_SIZES, **(MOE_SIZES if moe else {}))
    return config


def as_bf16(model):
    """Every float parameter in bf16 but those the model's cast_predicate
    keeps (A_log), as `mlx_lm.convert --dtype bfloat16` does."""
    keep = model.cast_predicate

    def cast(name, value):
        if keep(name) and mx.issubdtype(value.dtype, mx.floating):
            return value.astype(mx.bfloat16)
        return value

    model.update(tree_map_with_path(cast, model.parameters()))
    mx.eval(model.parameters())
    return model


def main(out_dir: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp)
        make_fixtures.write_tokenizer(tokenizer_dir)
        for name, (moe, seed, overrides) in TARGETS.items():
            config = target_config(moe)
            model = as_bf16(make_fixtures.random_model(copy.deepcopy(config), seed))
            path = out_dir / name
            shutil.rmtree(path, ignore_errors=True)
            make_fixtures.write_mlx_quantized(path, config, model, 4, overrides)
            for file in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(tokenizer_dir / file, path / file)
            print(f"wrote {path}")
    for name, (base, seed) in DRAFTERS.items():
        cfg = dict(copy.deepcopy(base), **DRAFTER_SIZES)
        draft = make_drafters.random_drafter(cfg, seed)
        make_drafters.save_drafter(out_dir / name, cfg, draft, dtype=mx.bfloat16)
        print(f"wrote {out_dir / name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
