#!/usr/bin/env python
"""Ablation table from tuning runs: recall at a chunk cap for chosen configs, one row per lever.

Each ``--row`` is ``LABEL=DIR_TEMPLATE:KEY=VALUE,KEY=VALUE``: ``DIR_TEMPLATE`` is a
``scripts/tune_efficientrag.py --output`` folder with ``{dataset}`` in it, and the key/values pick
one configuration of its ``results.jsonl`` (every key must match the run's resolved config). A cell
is that configuration's recall with its pool cut at ``--cap`` chunks (``max_candidates=cap``) and,
in brackets, the average chunks; the Direct-R row comes from the same folder's ``curve.json``.

    python scripts/efficientrag_ablation.py --datasets hotpotqa 2wikimqa musique --cap 7 \\
        --row "paper pool=runs/ablation/all-{dataset}:pool_source=continue,first_hop_k=10" ... \\
        --output reports/efficientrag/ablation.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.evaluation.report import md_table
from effrag.jsonl import read_jsonl


def parse_value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return None if v == "None" else v


def parse_row(spec: str) -> tuple[str, str, dict]:
    label, sep, rest = spec.partition("=")
    folder, _, keys = rest.partition(":")
    if not sep or not folder:
        raise SystemExit(f"--row {spec!r}: expected LABEL=DIR_TEMPLATE:KEY=VALUE,...")
    want = {}
    for kv in filter(None, keys.split(",")):
        k, s, v = kv.partition("=")
        if not s:
            raise SystemExit(f"--row {spec!r}: {kv!r} is not KEY=VALUE")
        want[k] = parse_value(v)
    return label, folder, want


def cell(folder: Path, want: dict, cap: int) -> str:
    path = folder / "results.jsonl"
    if not path.is_file():
        return "-"
    rows = list(read_jsonl(path))
    match = [r for r in rows if all(r["config"].get(k) == v for k, v in want.items())]
    if not match:
        raise SystemExit(f"{path}: no configuration with {want}")
    if len(match) > 1:
        raise SystemExit(f"{path}: {len(match)} configurations match {want}; add keys to pick one")
    point = next((c for c in match[0]["curve"] if c[0] == cap), None)
    if point is None:
        raise SystemExit(f"{path}: no curve point at {cap} chunks")
    n = match[0]["setup"]["n"]
    return f"{100 * point[1]:.1f} ({point[2]:.1f}; n={n})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", required=True)
    p.add_argument("--row", action="append", required=True, metavar="LABEL=DIR_TEMPLATE:KEY=VALUE,...")
    p.add_argument("--cap", type=int, default=7)
    p.add_argument("--direct-r", nargs="*", type=int, default=[7, 30], metavar="K",
                   help="Direct-R@K rows, from the first row's curve.json (default 7 30)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    rows = [parse_row(r) for r in args.row]
    table = []
    first = rows[0][1]
    for k in args.direct_r:
        cells = []
        for ds in args.datasets:
            curve = Path(first.format(dataset=ds)) / "curve.json"
            d = {x["k"]: x for x in json.loads(curve.read_text())["direct_r"]} if curve.is_file() else {}
            cells.append(f"{100 * d[k]['recall']:.1f}" if k in d else "-")
        table.append([f"Direct-R@{k} (same questions)", *cells])
    for label, folder, want in rows:
        table.append([label, *(cell(Path(folder.format(dataset=ds)), want, args.cap) for ds in args.datasets)])
    text = md_table([f"lever (recall % with the pool cut at {args.cap} chunks; avg chunks, questions)", *args.datasets],
                    table, "l" + "r" * len(args.datasets))
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
