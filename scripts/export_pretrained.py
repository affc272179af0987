"""Copy a trained model into the package as a compact shipped model (``effrag.pretrained``).

    python scripts/export_pretrained.py --src checkpoints/efficientrag-all \
        --dst effrag/pretrained/efficientrag-all
    python scripts/export_pretrained.py --kind reader --src checkpoints/reader-all --dst effrag/pretrained/reader-all
    python scripts/export_pretrained.py --kind irrr --src checkpoints/irrr-all --dst effrag/pretrained/irrr-all

``--kind reader`` / ``--kind irrr`` copy one checkpoint folder (what ``scripts/train_models.py`` installs)
with its encoder stored as int8 rows, its training card as ``TRAINING.md`` (the shipped card, ``README.md``,
is to be written with its figures) and ``export.json``; the shipped name then resolves to it
(``effrag eval --reader reader-all``, ``--method irrr``). The default, ``--kind efficientrag``:

Reads ``SRC/labeler``, ``SRC/filter`` and ``SRC/loop-<dataset>.json`` (what
``bash scripts/train_efficientrag.sh all`` writes), stores both encoders as int8 rows
(:mod:`effrag.models.compact`, a quarter of the size, dequantized to fp32 on load), copies the loop
configs and the source model cards, and writes ``DST/README.md`` (the shipped model's card) and
``DST/export.json`` (provenance: the source weights' sha256, versions, command). The retrieval
figures of the shipped weights come from ``effrag quickstart``, which evaluates exactly this directory.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from effrag.models import FilterModel, LabelerModel, load_model
from effrag.models.compact import COMPACT_NAME
from effrag.provenance import file_sha256, portable, portable_path, provenance

DATASETS = ("hotpotqa", "2wikimqa", "musique")


def export(src: Path, dst: Path, figures: Path | None = None) -> dict:
    for need in ("labeler", "filter", *(f"loop-{d}.json" for d in DATASETS)):
        if not (src / need).exists():
            raise SystemExit(f"{src / need} not found: train the model first (bash scripts/train_efficientrag.sh all)")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    sizes, sources = {}, {}
    for name, cls in (("labeler", LabelerModel), ("filter", FilterModel)):
        model = cls.from_pretrained(src / name)
        model.save_pretrained(dst / name, compact=True)
        if (src / name / "README.md").is_file():
            shutil.copy(src / name / "README.md", dst / name / "TRAINING.md")
        sizes[name] = (dst / name / COMPACT_NAME).stat().st_size
        sources[name] = {"model.safetensors": file_sha256(src / name / "model.safetensors")}
    for d in DATASETS:
        shutil.copy(src / f"loop-{d}.json", dst / f"loop-{d}.json")
    if (src / "README.md").is_file():
        shutil.copy(src / "README.md", dst / "RECIPE.md")
    info = portable({"source": str(src), "source_sha256": sources, "int8_bytes": sizes, **provenance()})
    (dst / "export.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    card = _card(src, sizes)
    if figures is not None:  # the quickstart's table for exactly these weights
        card += ("\n## Figures of these (int8) weights\n\nFrom `effrag quickstart` (dense MiniLM retriever, the bundled "
                 "dev questions, corpus = the bundled sample's contexts):\n\n" + figures.read_text().split("\n", 2)[-1])
    (dst / "README.md").write_text(card)
    return info


def export_checkpoint(kind: str, src: Path, dst: Path) -> dict:
    """One checkpoint folder (a reader or an IRRR model) into ``dst``, its encoder as int8 rows."""
    model = load_model(src)
    if model.model_type != kind:
        raise SystemExit(f"{src}: model_type is {model.model_type!r}, not {kind!r}")
    if dst.exists():
        shutil.rmtree(dst)
    model.save_pretrained(dst, compact=True)
    for name in ("README.md", "metrics.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / ("TRAINING.md" if name == "README.md" else name))
    info = portable({"source": str(src), "source_sha256": {"model.safetensors": file_sha256(src / "model.safetensors")},
                     "int8_bytes": {kind: (dst / COMPACT_NAME).stat().st_size}, **provenance()})
    (dst / "export.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return info


def _card(src: Path, sizes: dict) -> str:
    mb = {k: f"{v / 1e6:.1f} MB" for k, v in sizes.items()}
    return f"""# efficientrag-all (shipped with effrag)

EfficientRAG Labeler and Filter (all-MiniLM-L6-v2 fine-tunes, 22.7M parameters each) and the loop
configs tuned on each dataset's dev file, as produced by the project's recommended recipe
`bash scripts/train_efficientrag.sh all` (annotation-derived training data from the HotpotQA,
2WikiMultihopQA and MuSiQue train files in `../shared/data`, pooled: 1,099 questions).

- `labeler/`, `filter/`: effrag checkpoints whose encoder is stored as int8 rows
  (`{COMPACT_NAME}`, labeler {mb['labeler']}, filter {mb['filter']}; see `effrag/models/compact.py`),
  dequantized to fp32 when loaded. `TRAINING.md` in each is the training run's own card.
- `loop-<dataset>.json`: the loop options tuned on that dataset's dev file (the recipe's chunk budget, `BUDGET`, default 10).
- `RECIPE.md`: the recipe's card with its dev figures (fp32 weights, full dev files);
  `export.json`: the sha256 of the source weights, versions and the export command.

Use it (offline):

```python
from effrag.pretrained import pretrained_path
d = pretrained_path("efficientrag-all")
# effrag eval --method efficientrag --labeler $D/labeler --filter $D/filter --er-config $D/loop-musique.json ...
```

`effrag quickstart` evaluates this directory against Direct-R on the bundled dev questions and prints
whether EfficientRAG reaches Direct-R@20's recall with at most 10 chunks on each dataset.

Exported from `{portable_path(src)}` by `python scripts/export_pretrained.py --src {portable_path(src)} --dst <this directory>`.
Licences of the training data: HotpotQA CC BY-SA 4.0, 2WikiMultihopQA Apache-2.0, MuSiQue CC BY 4.0;
all-MiniLM-L6-v2 Apache-2.0.
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("efficientrag", "reader", "irrr"), default="efficientrag",
                    help="an EfficientRAG system folder (default) or one reader / IRRR checkpoint folder")
    ap.add_argument("--src", type=Path, help="default checkpoints/efficientrag-all (reader-all, irrr-all)")
    ap.add_argument("--dst", type=Path, help="default effrag/pretrained/<the src folder's name>")
    ap.add_argument("--figures", type=Path, help="a quickstart comparison.md of these weights, added to the card")
    args = ap.parse_args(argv)
    src = args.src or Path("checkpoints") / ("efficientrag-all" if args.kind == "efficientrag" else f"{args.kind}-all")
    dst = args.dst or Path("effrag/pretrained") / src.name
    info = export(src, dst, args.figures) if args.kind == "efficientrag" else export_checkpoint(args.kind, src, dst)
    print(json.dumps({"dst": str(dst), "int8_bytes": info["int8_bytes"]}, indent=2))


if __name__ == "__main__":
    main()
