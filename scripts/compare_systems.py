"""Does a recipe run make what ships? Two EfficientRAG system folders' loop configs compared: the same picks, and
every cross-fitted recall within one point (``effrag.tuning.compare_systems``; step 9 of
``bash scripts/train_efficientrag.sh``).

    python scripts/compare_systems.py runs/export/efficientrag-all effrag/pretrained/efficientrag-all \
        --output checkpoints/efficientrag-all/versus-shipped.md

Prints the table; ``--strict`` exits 1 when the verdict is no.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.cli_args import add_output_arg
from effrag.provenance import portable_path
from effrag.tuning.compare_systems import TOLERANCE, compare_systems, comparison_markdown


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="a system folder (e.g. the recipe's export)")
    p.add_argument("b", type=Path, help="the system folder to compare with (e.g. effrag/pretrained/efficientrag-all)")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="recall, as a fraction (default 0.01)")
    add_output_arg(p, help="write the markdown here, and its data beside it as .json", metavar="FILE")
    p.add_argument("--strict", action="store_true", help="exit 1 when the picks differ or a recall is not within")
    args = p.parse_args(argv)
    try:
        result = compare_systems(args.a, args.b, args.tolerance)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"compare_systems: {e}")
    md = comparison_markdown(result, portable_path(args.a.resolve()), portable_path(args.b.resolve()))
    print(md)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(md)
        args.output.with_suffix(".json").write_text(json.dumps(
            {**result, "a": portable_path(args.a.resolve()), "b": portable_path(args.b.resolve())}, indent=2) + "\n")
    return 1 if args.strict and not result["verdict"] else 0


if __name__ == "__main__":
    sys.exit(main())
