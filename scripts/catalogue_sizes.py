"""Bytes of the files an MLX conversion of a published target holds,
computed from its config.json (tests/fixtures/target_configs) by the rules
the conversion tools follow (docs/checkpoints.md, "What a download holds"):

    python scripts/catalogue_sizes.py

- mlx-lm's affine quantization of every Linear/Embedding whose input width
  is a multiple of the group size: bits/8 bytes a weight plus a bf16 scale
  and bias per group of 64; MoE router and shared-expert gates at 8 bits;
- everything else (norms, conv kernels, A_log, dt_bias) in bf16;
- the vision tower as mlx-vlm keeps it: bf16, unquantized (27 ViT blocks
  with LayerNorm and biases, patch and position embeddings, the 2x2 merger);
- no MTP head (mlx-lm and mlx-vlm drop it);
- the tokenizer and config files: Qwen3.5-9B's as a public manifest lists
  them (tokenizer.json 12,807,982 bytes, tokenizer_config.json 16,710) plus
  a few kB of small JSON files.

These are computed sizes, not the repos' listings: a safetensors header
adds a few hundred kB, and a repo may quantize its vision tower too.
"""

import json
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "tests/fixtures/target_configs"
GROUP = 64
TOKENIZER_FILES = 12_807_982 + 16_710 + 20_000


def linear(out: int, inp: int, bits: int) -> int:
    """Bytes of one quantized linear map (packed weights, bf16 scales and biases)."""
    if inp % GROUP:
        return 2 * out * inp
    return out * inp * bits // 8 + 2 * 2 * out * (inp // GROUP)


def text_bytes(t: dict, bits: int) -> int:
    h, layers = t["hidden_size"], t["num_hidden_layers"]
    n, kv, d = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    kh, vh = t["linear_num_key_heads"], t["linear_num_value_heads"]
    kd, vd = t["linear_key_head_dim"], t["linear_value_head_dim"]
    key, value = kh * kd, vh * vd
    conv = 2 * key + value
    total = 2 * linear(t["vocab_size"], h, bits) + 2 * h  # embed, lm_head, norm
    for i in range(layers):
        total += 2 * 2 * h  # the two layer norms
        if (i + 1) % t["full_attention_interval"]:
            total += linear(conv, h, bits) + linear(value, h, bits)
            total += 2 * linear(vh, h, bits) + linear(h, value, bits)
            total += 2 * (conv * t["linear_conv_kernel_dim"] + 2 * vh + vd)
        else:
            total += linear(2 * n * d, h, bits) + 2 * linear(kv * d, h, bits)
            total += linear(h, n * d, bits) + 2 * 2 * d
        if t.get("num_experts"):
            e, mi, si = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
            total += linear(e, h, 8) + linear(1, h, 8)  # the 8-bit gates
            total += e * (2 * linear(mi, h, bits) + linear(h, mi, bits))
            total += 2 * linear(si, h, bits) + linear(h, si, bits)
        else:
            i_ = t["intermediate_size"]
            total += 2 * linear(i_, h, bits) + linear(h, i_, bits)
    return total


def vision_bytes(v: dict) -> int:
    c, m, blocks = v["hidden_size"], v["intermediate_size"], v["depth"]
    patch = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2
    params = c * patch + c + v["num_position_embeddings"] * c
    per_block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (m * c + m) + (c * m + c)
    merged = c * v["spatial_merge_size"] ** 2
    params += blocks * per_block + 2 * c + (merged * merged + merged)
    params += v["out_hidden_size"] * merged + v["out_hidden_size"]
    return 2 * params


def main():
    for file in ("qwen3.5-9b-unsloth.json", "qwen3.6-35b-a3b.assembled.json"):
        config = json.loads((CONFIGS / file).read_text())
        vision = vision_bytes(config["vision_config"])
        for bits in (4, 8):
            text = text_bytes(config["text_config"], bits)
            print(f"{file} {bits}-bit: text {text:,} + vision (bf16) {vision:,} "
                  f"+ tokenizer {TOKENIZER_FILES:,} = {text + vision + TOKENIZER_FILES:,} bytes")


if __name__ == "__main__":
    main()
