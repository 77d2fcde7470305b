"""The tiny drafters tests/fixtures/make_drafters.py writes from the published
drafter configs (tests/fixtures/drafter_configs) carry exactly the published
keys and values; only the sizes (SCALED_KEYS) are scaled to the fixtures'."""

import json
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_drafters  # noqa: E402  (needs the path above)

CONFIGS = sorted(p.name for p in (FIXTURES / "drafter_configs").glob("*.json"))


def flatten(config: dict, prefix: str = "") -> dict:
    """Every key as a dotted path (nested dicts opened) to its value."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def published(file: str) -> dict:
    return json.loads((FIXTURES / "drafter_configs" / file).read_text())


def test_every_published_config_has_a_tiny_drafter():
    assert CONFIGS == sorted(make_drafters.PUBLISHED_DRAFTERS)
    names = [name for name, _, _ in make_drafters.PUBLISHED_DRAFTERS.values()]
    assert len(set(names)) == len(names)
    # The two names older tests and docs use are kept.
    assert {"drafter-published-nested-f32", "drafter-published-yarn-f32"} <= set(names)


@pytest.mark.parametrize("file", CONFIGS)
def test_tiny_drafter_config_is_the_published_one_with_sizes_scaled(file):
    tiny = make_drafters.published_drafter_config(file)
    source = published(file)
    if file == "dspark-yarn-rope.json":
        # Only a rope block: the nested z-lab drafter with that block.
        assert set(source) == {"rope_parameters"}
        assert tiny["rope_parameters"] == source["rope_parameters"]
        source = dict(published("zlab-qwen3.5-nested.json"), **source)
    flat_tiny, flat_source = flatten(tiny), flatten(source)
    assert set(flat_tiny) == set(flat_source), file
    changed = {k for k in flat_source if flat_tiny[k] != flat_source[k]}
    assert changed <= make_drafters.SCALED_KEYS, f"{file}: {changed - make_drafters.SCALED_KEYS}"
    # Types kept too (an int stays an int: serde and z-lab read the same JSON).
    for key in set(flat_source) - make_drafters.SCALED_KEYS:
        assert type(flat_tiny[key]) is type(flat_source[key]), key


@pytest.mark.parametrize("file", CONFIGS)
def test_tiny_drafter_sizes_fit_the_fixture_target(file):
    tiny = make_drafters.published_drafter_config(file)
    source = published(file) if file != "dspark-yarn-rope.json" else published("zlab-qwen3.5-nested.json")
    layers = make_drafters.TINY_TARGET_LAYERS
    assert (tiny["hidden_size"], tiny["vocab_size"], tiny["head_dim"]) == (64, 512, 16)
    assert tiny["num_key_value_heads"] == make_drafters.TINY_KV_HEADS
    # The published grouping of query heads over key/value heads is kept.
    assert (tiny["num_attention_heads"] * source["num_key_value_heads"]
            == source["num_attention_heads"] * tiny["num_key_value_heads"])
    taps = tiny["dflash_config"]["target_layer_ids"]
    assert taps == sorted(set(taps)) and all(0 <= t < layers for t in taps), taps
    assert len(taps) == min(layers, len(source["dflash_config"]["target_layer_ids"]))
    assert tiny["dflash_config"]["mask_token_id"] == make_drafters.MASK_TOKEN_ID
    assert tiny.get("num_target_layers", layers) == layers
    if tiny.get("sliding_window") is not None:
        # It binds within the fixture prompt (12 tokens), as 4096 does on long ones.
        assert 1 < tiny["sliding_window"] < 12
    elif "sliding_window" in source:
        # Published as null (no sliding layers): kept null.
        assert source["sliding_window"] is None and tiny["sliding_window"] is None
    assert len(tiny.get("layer_types") or [None] * tiny["num_hidden_layers"]) == tiny["num_hidden_layers"]


def test_scaled_maps_taps_by_relative_depth():
    config = dict(published("zlab-qwen3.5-legacy.json"))
    config["dflash_config"] = {"mask_token_id": 9, "target_layer_ids": [0, 20, 40]}
    # Depth 41 -> 4 layers: 0 -> 0, 20 -> 1, 40 -> 3.
    assert make_drafters.scaled(config)["dflash_config"]["target_layer_ids"] == [0, 1, 3]
    del config["num_target_layers"]  # then one past the last tap: 41 again
    assert make_drafters.scaled(config)["dflash_config"]["target_layer_ids"] == [0, 1, 3]
