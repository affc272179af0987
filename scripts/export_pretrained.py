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
The export itself: :mod:`effrag.training.export` (``export_system``, ``export_checkpoint``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.training.export import export_checkpoint, export_system


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("efficientrag", "reader", "irrr"), default="efficientrag",
                    help="an EfficientRAG system folder (default) or one reader / IRRR checkpoint folder")
    ap.add_argument("--src", type=Path, help="default checkpoints/efficientrag-all (reader-all, irrr-all)")
    ap.add_argument("--dst", type=Path, help="default effrag/pretrained/<the src folder's name>")
    ap.add_argument("--figures", type=Path, help="a quickstart comparison.md of these weights, added to the card")
    ap.add_argument("--prune", action="store_true", help="export nothing: remove from the system folder --dst every "
                    "ranker-<name>/ no loop config reads with (the recipe's last step)")
    args = ap.parse_args(argv)
    if args.prune:
        if args.dst is None:
            ap.error("--prune needs --dst (the exported system folder)")
        from effrag.training.export import prune_rankers
        print(json.dumps({"pruned": prune_rankers(args.dst)}))
        return
    src = args.src or Path("checkpoints") / ("efficientrag-all" if args.kind == "efficientrag" else f"{args.kind}-all")
    dst = args.dst or Path("effrag/pretrained") / src.name
    try:
        info = export_system(src, dst, args.figures) if args.kind == "efficientrag" else \
            export_checkpoint(args.kind, src, dst)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    print(json.dumps({"dst": str(dst), "int8_bytes": info["int8_bytes"]}, indent=2))


if __name__ == "__main__":
    main()
