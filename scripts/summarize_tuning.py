#!/usr/bin/env python
"""One option's effect in a tuning folder: the best recall per value (or per combination of values).

Every row of a tuner's ``results.jsonl`` (``scripts/tune_efficientrag.py``) holds its config and its curve (the
recall of its pool cut at 1..10 chunks). This groups the rows by the options named in ``--by`` and prints, per
group, the best recall at each budget (each budget's best may come from a different row of the group), with the
seen recall and chunks of the row that is best at the last budget. Options at their defaults are left out of a
row's config; they show as ``default``.

    python scripts/summarize_tuning.py runs/tune/all-musique --by query_chunks,filter_threshold --budgets 7,10
    python scripts/summarize_tuning.py runs/tune/all-musique --by token_threshold --where query_chunks=1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.cli_args import DATASETS, add_budgets_arg


def _curve(row: dict, skip: set[str]) -> dict[int, float]:
    """The row's recall at each cut, over its questions but ``skip`` (from its per-question gold positions)."""
    if not skip:
        return {int(k): rec for k, rec, _ in row.get("curve") or []}
    if "per_question" not in row:
        raise ValueError("--exclude-sample needs rows with per-question scores (rerun the grid)")
    kept = [pq for pq in row["per_question"] if pq[0] not in skip]
    return {c: sum((sum(1 for at in pq[2] if at <= c) / pq[1]) if pq[1] else 1.0 for pq in kept) / len(kept)
            for c in range(1, 11)}


def summarize(rows: list[dict], by: list[str], budgets: list[int], where: dict[str, str] | None = None,
              skip: set[str] = frozenset()) -> str:
    groups: dict[tuple, dict] = {}
    for row in rows:
        cfg = row["config"]
        if any(str(cfg.get(k, "default")) != v for k, v in (where or {}).items()):
            continue
        curve = _curve(row, skip)
        key = tuple(str(cfg.get(k, "default")) for k in by)
        g = groups.setdefault(key, {"best": {}, "last": None, "n": 0})
        g["n"] += 1
        for b in budgets:
            if b in curve and curve[b] > g["best"].get(b, -1.0):
                g["best"][b] = curve[b]
                if b == budgets[-1]:
                    g["last"] = row
    head = [*by, *(f"recall@{b}" for b in budgets), "seen recall", "seen chunks", "configs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        g, last = groups[key], groups[key]["last"] or {}
        cells = [*key, *(f"{100 * g['best'][b]:.2f}" if b in g["best"] else "" for b in budgets),
                 f"{100 * last['seen_recall']:.2f}" if "seen_recall" in last else "",
                 f"{last['avg_seen']:.1f}" if "avg_seen" in last else "", str(g["n"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a tuning folder (results.jsonl) or a results.jsonl file")
    p.add_argument("--by", required=True, help="comma-separated config options to group by")
    add_budgets_arg(p, help="chunk budgets; the last one picks the row whose seen figures are shown", one_value=True)
    p.add_argument("--where", nargs="*", default=[], metavar="OPTION=VALUE", help="keep only these rows")
    p.add_argument("--exclude-sample", action="store_true",
                   help="score only the questions outside the bundled sample (the headline's questions)")
    args = p.parse_args(argv)
    path = args.folder / "results.jsonl" if args.folder.is_dir() else args.folder
    if not path.is_file():
        p.error(f"{path} not found")
    where = {}
    for item in args.where:
        k, sep, v = item.partition("=")
        if not sep:
            p.error(f"--where {item!r}: expected OPTION=VALUE")
        where[k] = v
    budgets = args.budgets
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                p.error(f"{path}:{n}: not JSON ({e.msg})")
    skip: set[str] = set()
    if args.exclude_sample:
        from effrag.data import sample_question_ids

        skip = set(sample_question_ids(DATASETS))
    try:
        print(summarize(rows, [b for b in args.by.split(",") if b], budgets, where, skip))
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
