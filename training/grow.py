"""A deeper drafter that drafts exactly what a trained one drafts.

    python training/grow.py DRAFTER LAYERS OUT

Loads DRAFTER (a z-lab format folder) into a drafter of LAYERS layers
(train_drafter.load_grown: the added layers' output projections zero, so
each passes its input through) and writes it to OUT in bf16. Its drafts,
and so its accept length, equal DRAFTER's; only its forward costs more.
That prices a deeper drafter before training one: the accept length a
grown-and-trained drafter must reach to pay for its layers
(docs/acceptance.md, "What a deeper drafter must earn").
"""

import argparse
import copy
import json
from pathlib import Path

import mlx.core as mx

import common  # noqa: F401  (puts tests/fixtures on the path)
from make_drafters import save_drafter, zlab_config
from train_drafter import load_grown

from dflash import model_mlx as zlab


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter", type=Path)
    parser.add_argument("layers", type=int)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    cfg = json.loads((args.drafter / "config.json").read_text())
    cfg = dict(copy.deepcopy(cfg), num_hidden_layers=args.layers)
    draft = zlab.DFlashDraftModel(zlab_config(cfg))
    added = load_grown(draft, args.drafter / "model.safetensors")
    mx.eval(draft.parameters())
    save_drafter(args.out, cfg, draft, dtype=mx.bfloat16)
    print(f"{args.out}: {args.layers} layers ({added} added as the identity)")


if __name__ == "__main__":
    main()
