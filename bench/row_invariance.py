"""Is MLX's quantized matmul row-invariant here? Row i of an M-row product
must equal, bit for bit, the 1-row product of row i, or a verify (M = block)
and a decode step (M = 1) can pick different tokens at a near tie and DFlash
stops being lossless (docs/dflash.md, "Lossless").

    python3 bench/row_invariance.py [--model models/default/target]

For every quantized linear layer of the model (and its tied lm_head), then
for the Qwen3.5-9B layer shapes at 4 bits with random weights, it prints how
many of the M rows differ from their 1-row products and the largest
difference, for M = 2, 4, 16 and bf16 activations. Deterministic inputs
(seeded), so two runs on one device print the same table.
"""

import argparse
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

ROOT = Path(__file__).resolve().parent.parent
ROWS = (2, 4, 16)
# (name, in, out) of the 9B's matmuls, 4-bit group 64 (docs/performance.md).
SHAPES_9B = [("mlp gate+up", 4096, 24576), ("mlp down", 12288, 4096), ("attn o / gdn out", 4096, 4096)]


def check(name: str, run, width: int):
    """run(x [M, width]) -> [M, out]; one line per M."""
    for m in ROWS:
        x = mx.random.normal((m, width), key=mx.random.key(m)).astype(mx.bfloat16)
        full = run(x)
        single = mx.concatenate([run(x[i:i + 1]) for i in range(m)])
        diff = mx.abs(full.astype(mx.float32) - single.astype(mx.float32))
        rows = int(mx.sum(mx.any(diff > 0, axis=-1)).item())
        print(f"{name:<32} M={m:<3} rows differing {rows:>2}/{m:<3} max |diff| {diff.max().item():.3e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=ROOT / "models/default/target")
    args = parser.parse_args()
    from mlx_lm.utils import load_model

    print("device", mx.default_device())
    model, _ = load_model(args.model)
    seen = set()
    for path, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            shape = (module.weight.shape, module.bits, module.group_size)
            if shape in seen:
                continue
            seen.add(shape)
            width = module.weight.shape[1] * 32 // module.bits
            check(f"{path} ({module.bits}-bit)", module, width)
        elif isinstance(module, nn.QuantizedEmbedding):
            width = module.weight.shape[1] * 32 // module.bits
            check(f"{path}.as_linear ({module.bits}-bit)", module.as_linear, width)
    for name, k, n in SHAPES_9B:
        w = mx.random.normal((n, k), key=mx.random.key(k + n)).astype(mx.bfloat16) * 0.02
        wq, scales, biases = mx.quantize(w, group_size=64, bits=4)

        def run(x, wq=wq, scales=scales, biases=biases):
            return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=64, bits=4)

        check(f"9B {name} {k}->{n} (4-bit)", run, k)


if __name__ == "__main__":
    main()
