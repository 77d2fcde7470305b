"""The reference venv holds exactly the Python references later parity tests
compare against, and they run on this machine's MLX CPU backend."""

from importlib.metadata import version

import mlx.core as mx


def test_pinned_reference_versions():
    assert version("mlx") == "0.32.4"
    assert version("mlx-lm") == "0.32.2"
    assert version("dflash") == "0.1.0"


def test_references_import():
    from dflash import model_mlx  # z-lab's DFlash MLX code
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    assert hasattr(model_mlx, "stream_generate")
    assert hasattr(qwen3_5, "Model") and hasattr(qwen3_5_moe, "Model")


def test_mlx_cpu_computes():
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    out = a @ a.T
    assert out.tolist()[1][2] == sum(float(4 + i) * float(8 + i) for i in range(4))
