"""Whether mlx-lm's forward gives the same bits twice on a checkpoint: the
reference beside `prefill_repeat` (docs/gpu.md, "Same prompt, same answer").

    python bench/prefill_repeat_mlx_lm.py MODEL LEN [RUNS]

The same LEN-token prompt as `prefill_repeat` (token i is 5 + 7919 i modulo
the vocabulary, at most 3,000), RUNS times (default 3) from a fresh cache.
For each later run it prints the first layer whose output differs from the
first run's (with how many positions differ) and whether the logits are the
same bits. If mlx-lm's own forward does not repeat on CUDA, the cause is in
MLX's ops both share, not in our kernels.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_mlx_lm import gather_qmm_without_global_scale  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: prefill_repeat_mlx_lm.py MODEL LEN [RUNS]")
    path, length = sys.argv[1], int(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    gather_qmm_without_global_scale()
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(path)
    text = model.language_model if hasattr(model, "language_model") else model
    inner = text.model
    config = json.loads((Path(path) / "config.json").read_text())
    vocab_size = config.get("text_config", config).get("vocab_size", config.get("vocab_size"))
    vocab = max(1, min(vocab_size - 5, 3000))
    ids = mx.array([[5 + (i * 7919) % vocab for i in range(length)]])

    outputs = []

    # A module is called through its class: wrap each layer class's call
    # once, keeping every decoder layer's output in call order.
    for cls in {type(layer) for layer in inner.layers}:

        def tapped(self, *args, _call=cls.__call__, **kwargs):
            y = _call(self, *args, **kwargs)
            outputs.append(y)
            return y

        cls.__call__ = tapped

    def once():
        outputs.clear()
        logits = model(ids, cache=make_prompt_cache(model))
        mx.eval(logits, *outputs)
        return list(outputs), logits

    first_taps, first_logits = once()
    for run in range(1, runs):
        taps, logits = once()
        report = "every layer's output the same bits"
        for layer, (a, b) in enumerate(zip(first_taps, taps)):
            differing = int(mx.any(a != b, axis=(0, 2)).astype(mx.int32).sum().item())
            if differing:
                report = f"layer {layer} differs first ({differing} of {length} positions)"
                break
        same = bool(mx.array_equal(first_logits, logits).item())
        print(f"mlx-lm run {run + 1}: {report}; logits the same: {same}", flush=True)


if __name__ == "__main__":
    main()
