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

from effrag.models import FilterModel, LabelerModel, RankerModel, load_model
from effrag.models.compact import COMPACT_NAME, has_compact_encoder
from effrag.provenance import file_sha256, portable, portable_path, provenance

DATASETS = ("hotpotqa", "2wikimqa", "musique")


def export(src: Path, dst: Path, figures: Path | None = None) -> dict:
    for need in ("labeler", "filter", "loop.json", *(f"loop-{d}.json" for d in DATASETS)):
        if not (src / need).exists():
            raise SystemExit(f"{src / need} not found: train the model first (bash scripts/train_efficientrag.sh all)")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    sizes, sources = {}, {}
    models = [("labeler", LabelerModel), ("filter", FilterModel)] + ([("ranker", RankerModel)]
                                                                      if (src / "ranker").is_dir() else [])
    for name, cls in models:
        # a folder that already holds int8 rows (a shipped system retuned in place) is copied as it is
        if has_compact_encoder(src / name):
            shutil.copytree(src / name, dst / name)
            sources[name] = {COMPACT_NAME: file_sha256(src / name / COMPACT_NAME)}
        else:
            model = cls.from_pretrained(src / name)
            model.save_pretrained(dst / name, compact=True)
            sources[name] = {"model.safetensors": file_sha256(src / name / "model.safetensors")}
            if (src / name / "README.md").is_file():
                shutil.copy(src / name / "README.md", dst / name / "TRAINING.md")
        sizes[name] = (dst / name / COMPACT_NAME).stat().st_size
    for f in ["loop.json", *(f"loop-{d}.json" for d in DATASETS)]:
        shutil.copy(src / f, dst / f)
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
    mb = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items())
    general = json.loads((src / "loop.json").read_text())
    kind = general.get("retriever") or "dense"
    rows = []
    for name in ["loop.json", *(f"loop-{d}.json" for d in DATASETS)]:
        cfg = json.loads((src / name).read_text())
        for ds, fig in (cfg.get("crossfit") or {}).items():
            rec = fig["recall"]
            rows.append(f"| `{name}` | {ds} | {fig['n']} | {100 * rec['7']:.1f} | {100 * rec['10']:.1f} | "
                        f"{' / '.join(f'{x:.0f}' for x in fig['forwards'])} |")
    table = "\n".join(["| config | dev file | questions | <= 7 chunks | <= 10 chunks | read per question "
                       "(Labeler / ranker / Filter) |", "|---|---|---:|---:|---:|---|", *rows])
    return f"""# efficientrag-all (shipped with effrag)

The recommended EfficientRAG system, as `bash scripts/train_efficientrag.sh all` makes it: a Labeler, a Filter and
a pool ranker (all-MiniLM-L6-v2 fine-tunes) trained on annotation-derived data from the HotpotQA, 2WikiMultihopQA
and MuSiQue train files in `../shared/data` (1,099 questions, pooled), and loop configs chosen on the dev files.
The loop runs over a **{kind}** retriever (the one its configs were tuned for, and the default wherever it is opened).

- `labeler/`, `filter/`, `ranker/`: effrag checkpoints whose encoders are stored as int8 rows ({mb}; the ranker's
  frozen word embeddings are taken from the installed all-MiniLM-L6-v2; see `effrag/models/compact.py`),
  dequantized to fp32 when loaded. `TRAINING.md` in each is its training run's card.
- `loop.json`: the general loop config, chosen jointly on the three dev files: the default, and what to use on a
  corpus of your own. `loop-<dataset>.json`: chosen on that dataset's dev file.
- `RECIPE.md`: the recipe's card with every figure; `export.json`: the sha256 of the source weights, versions
  and the export command.

## Which questions chose what
- The models: trained on the train files only; the ranker's installed checkpoint is the end of its schedule.
- The loop configs: chosen on the dev files' questions, **except** the bundled sample's 30 per dataset (what
  `effrag quickstart` shows), by the best mean recall with at most 7 and 10 chunks. The ranker's training-data
  options and the grid were settled on the same dev files.
- The figures below are **cross-fitted**: each question is scored by the config chosen on the other folds (5
  folds), so no figure comes from the questions that chose it. The chosen configs' own in-sample recall is in
  each file (`in_sample_recall`) and is not a figure to quote.

{table}

Against the strongest plain retriever on the same questions, the recipe's card (`RECIPE.md`) has the whole table.

## Use it (offline)

```python
from effrag import EfficientRAG
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # loop.json over its {kind} retriever
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl", dataset="musique")  # loop-musique.json
rag.retrieve("Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?")
```

`effrag eval --method efficientrag --questions dev.jsonl --corpus-from train.jsonl ...` uses it by default
(`--model efficientrag-all`, `--er-config .../loop-musique.json` for a per-dataset config).

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
