#!/usr/bin/env python
"""Where EfficientRAG loses gold passages, read from the per-hop traces of ``effrag eval`` runs.

Each gold passage of each question is put in one class:

* ``in pool``: in the returned chunks (what recall counts);
* ``labeled at hop h, cut``: retrieved and read by the Labeler at hop h, but ranked below the pool's cap
  (a ranking loss: a better pool order or Labeler would keep it);
* ``never retrieved``: no query of any hop found it (a query loss: hop 0's depth, or the next queries
  the Filter wrote from the kept words, did not reach it).

It also counts, per hop, how many gold passages were first seen there, and gives examples of next
queries that missed (question, kept words, next query, the missing gold title).

    python scripts/probes/efficientrag_misses.py runs/eval/hotpotqa runs/eval/musique --output reports/efficientrag/misses.md
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from effrag.evaluation import read_predictions
from effrag.evaluation.report import md_table


def read_rows(run: Path) -> list:
    """The run's predictions (:func:`effrag.evaluation.read_predictions`): an EfficientRAG run's, whose rows keep
    every hop; a bad line, or another method's run, is one error naming the file."""
    try:
        preds = read_predictions(run, method="efficientrag")
    except (OSError, ValueError) as e:
        raise SystemExit(str(e)) from None
    for n, p in enumerate(preds, 1):
        if not p.result.hops:
            raise SystemExit(f"{run}: row {n}: no hops recorded (not an EfficientRAG run?)")
    return preds


def classify(preds: list) -> tuple[Counter, Counter, list[str]]:
    classes, first_seen, examples = Counter(), Counter(), []
    for p in preds:
        hops = p.result.hops
        pool = set(p.result.ids)
        seen_at: dict[str, int] = {}
        for entry in hops:
            for cid in entry.read:
                seen_at.setdefault(cid, entry["hop"])
        for g in p.gold:
            if g in seen_at:
                first_seen[seen_at[g]] += 1
            if g in pool:
                classes["in pool"] += 1
            elif g in seen_at:
                classes[f"labeled at hop {seen_at[g]}, cut"] += 1
            else:
                classes["never retrieved"] += 1
                if len(examples) < 6 and len(hops) > 1:
                    kept = [f"{c['title']}: {c['kept']}" for c in hops[0].chunks if c["tag"] == "<Continue>"][:2]
                    examples.append(f"- Q: {p.question}\n  - kept at hop 0: {kept}\n  - next queries: "
                                    f"{[e.queries for e in hops[1:]]}\n  - missing gold id: {g}")
    return classes, first_seen, examples


def main(argv=None) -> int:
    from effrag.cli_args import add_output_arg, add_source_args
    from effrag.provenance import report_source

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="effrag eval output folders (or predictions.jsonl files)")
    add_output_arg(p, help="write the markdown here (default: print only)", metavar="FILE")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = (report_source(args.output.parent, args.allow_dirty, name=f"{args.output.stem}.uncommitted.diff")
              if args.output else None)  # printed only: nothing to check
    table, notes = [], []
    for run in args.runs:
        rows = read_rows(run)
        classes, first_seen, examples = classify(rows)
        total = sum(classes.values())
        cut = ", ".join(f"hop {k.split()[3].rstrip(',')}: {v}" for k, v in sorted(classes.items()) if k.endswith("cut"))
        pct = lambda v: f"{v} ({100 * v / max(1, total):.1f}%)"  # noqa: E731
        table.append([run, total, pct(classes["in pool"]), cut or "-", pct(classes["never retrieved"]),
                      ", ".join(f"hop {h}: {v}" for h, v in sorted(first_seen.items()))])
        notes += [f"\n### {run}: gold never retrieved (first examples)\n", *examples]
    header = ["run", "gold passages", "in pool", "labeled, cut (by hop)", "never retrieved", "first seen per hop"]
    text = md_table(header, table, "lrrlrl") + "".join(f"{n}\n" for n in notes)
    text += f"\nCommit {commit}.\n" if commit else ""
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
