"""Step 3: export and convert the trained pair, and write its manifest.

    python training/export.py WORK [DEST]      (DEST: models/default)

WORK holds step 1's target-raw (MLX, bf16) and step 2's drafter. The target
is written in the Hugging Face layout (HF tensor names, zero-centred norms,
conv weights [C, 1, K], f32 so the round trip is exact), then converted back
to MLX bf16 by mlx-lm's own `convert`, which is what users run on a
downloaded checkpoint; the result must equal the trained weights bit for bit.
The drafter is already in z-lab's format. DEST/manifest.json lists the sha256
and size of every file, the training settings and the corpus.

    python training/export.py --drafter WORK/drafter-TAG [DEST]

replaces only the drafter (a new step 2 over the committed target): the
target's files and training record stay, the manifest is rewritten.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

import common
from make_fixtures import to_hf_names

LIMIT_BYTES = 40_000_000


def export_hf(raw: Path, hf: Path):
    model = common.load_target(raw)
    weights = {n: v.astype(mx.float32) for n, v in tree_flatten(model.parameters())}
    weights = to_hf_names(weights, moe=False)
    weights.pop("mtp.fc.weight")  # to_hf_names adds a dummy MTP head for the loader tests
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir(parents=True)
    mx.save_safetensors(str(hf / "model.safetensors"), weights, metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(common.hf_config(), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(raw / name, hf / name)


def same_weights(a: Path, b: Path) -> float:
    wa = dict(tree_flatten(common.load_target(a).parameters()))
    wb = dict(tree_flatten(common.load_target(b).parameters()))
    assert wa.keys() == wb.keys(), "the converted target has other tensors"
    return max(mx.abs(wa[k].astype(mx.float32) - wb[k].astype(mx.float32)).max().item() for k in wa)


def write_manifest(dest: Path, reports: dict, bits):
    files = sorted(p for p in dest.rglob("*") if p.is_file() and p.name != "README.md"
                   and p.name != "manifest.json")
    total = sum(p.stat().st_size for p in files)
    if total > LIMIT_BYTES:
        sys.exit(f"the pair is {total / 1e6:.1f} MB, over the {LIMIT_BYTES / 1e6:.0f} MB limit")
    for report in reports.values():
        report.pop("log", None)
    manifest = {
        "files": {str(p.relative_to(dest)): {"sha256": common.sha256(p), "bytes": p.stat().st_size}
                  for p in files},
        "total_bytes": total,
        "target_quantization": {"bits": bits, "group_size": 64} if bits else None,
        "training": reports,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return total


def export_drafter(drafter: Path, dest: Path):
    """A new drafter for the committed target: its folder and the report
    train_drafter.py wrote beside it (train_drafter[-TAG].json)."""
    tag = drafter.name[len("drafter"):]
    report = json.loads((drafter.parent / f"train_drafter{tag}.json").read_text())
    old = json.loads((dest / "manifest.json").read_text())
    shutil.rmtree(dest / "drafter", ignore_errors=True)
    shutil.copytree(drafter, dest / "drafter")
    reports = dict(old["training"], train_drafter=report)
    bits = (old.get("target_quantization") or {}).get("bits")
    total = write_manifest(dest, reports, bits)
    print(f"wrote {dest / 'drafter'}: the pair is {total / 1e6:.1f} MB")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path, nargs="?")
    parser.add_argument("--drafter", type=Path, help="replace only the drafter with this folder")
    parser.add_argument("dest", type=Path, nargs="?", default=common.ROOT / "models" / "default")
    parser.add_argument("--bits", type=int, choices=[4, 8],
                        help="quantize the target (MLX affine, group 64); default bf16")
    args = parser.parse_args()
    if args.drafter:
        dest = args.work or args.dest  # `export.py --drafter D DEST`
        return export_drafter(args.drafter, dest)
    if args.work is None:
        parser.error("WORK is required (or --drafter)")
    from mlx_lm import convert

    hf = args.work / "target-hf"
    export_hf(args.work / "target-raw", hf)
    target = args.dest / "target"
    shutil.rmtree(target, ignore_errors=True)
    if args.bits:
        convert(str(hf), mlx_path=str(target), dtype="bfloat16", quantize=True, q_bits=args.bits,
                q_group_size=64)
    else:
        convert(str(hf), mlx_path=str(target), dtype="bfloat16")
    # mlx-lm rewrites the tokenizer through transformers and adds a model
    # card; ship the trained tokenizer files (the template lives in
    # tokenizer_config.json) and no generated card.
    for name in ("README.md", "chat_template.jinja"):
        (target / name).unlink(missing_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.work / "target-raw" / name, target / name)
    if not args.bits:
        diff = same_weights(args.work / "target-raw", target)
        if diff != 0.0:
            sys.exit(f"the converted target differs from the trained one by {diff}")
    drafter = args.dest / "drafter"
    shutil.rmtree(drafter, ignore_errors=True)
    shutil.copytree(args.work / "drafter", drafter)

    reports = {name: json.loads((args.work / f"{name}.json").read_text())
               for name in ("train_target", "train_drafter")}
    total = write_manifest(args.dest, reports, args.bits)
    print(f"wrote {args.dest}: {total / 1e6:.1f} MB" + ("" if args.bits else
          ", converted target identical to the trained one"))


if __name__ == "__main__":
    main()
