#!/usr/bin/env python
"""Which lever moved which number: one cross-fitted row per lever, from tuning folders.

Each ``--row`` is ``LABEL=DIR_TEMPLATE[:KEY=VALUE,...]``: ``DIR_TEMPLATE`` is a ``scripts/tune_efficientrag.py
--output`` folder with ``{dataset}`` in it; the optional key/values *restrict* its rows to configs with those
values (``retrieval_weight=0`` is the ranker's order alone). Within what is left, the configs are chosen and
scored as the shipped ones are (:func:`effrag.tuning.crossfit.crossfit`: per dataset, ``--folds`` folds, the
bundled sample's questions left out), so every cell is a held-out figure of that lever's grid. A cell is the
recall with at most each ``--budgets`` chunks; the last column is what the loop read per question.

    python scripts/probes/efficientrag_ablation.py --datasets hotpotqa 2wikimqa musique \\
        --row "ranker, hybrid=runs/tune/all-{dataset}" \\
        --row "ranker order only=runs/tune/all-{dataset}:retrieval_weight=0,requery_weight=0" \\
        --output reports/efficientrag/ablation.md
"""
from __future__ import annotations

import argparse
import json
import sys

from effrag.evaluation.report import md_table


def parse_value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"None": None, "none": None, "true": True, "false": False}.get(v, v)


def parse_row(spec: str) -> tuple[str, str, dict]:
    label, sep, rest = spec.partition("=")
    folder, _, keys = rest.partition(":")
    if not sep or not folder:
        raise SystemExit(f"--row {spec!r}: expected LABEL=DIR_TEMPLATE[:KEY=VALUE,...]")
    want = {}
    for kv in filter(None, keys.split(",")):
        k, eq, v = kv.partition("=")
        if not eq:
            raise SystemExit(f"--row {spec!r}: {kv!r} is not KEY=VALUE")
        want[k] = parse_value(v)
    return label, folder, want


def main(argv=None) -> int:
    from effrag.cli_args import add_budgets_arg, add_datasets_arg, add_keep_sample_arg, add_output_arg, add_source_args
    from effrag.provenance import report_source
    from effrag.tuning.crossfit import crossfit
    from effrag.tuning.loop_configs import read_rows

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_datasets_arg(p, help="datasets whose runs each row reads")
    p.add_argument("--row", action="append", required=True, metavar="LABEL=DIR_TEMPLATE[:KEY=VALUE,...]")
    add_budgets_arg(p)
    p.add_argument("--folds", type=int, default=5)
    add_keep_sample_arg(p, help="let the bundled sample's dev questions count too")
    add_output_arg(p, required=True, help="markdown table (a .json beside it holds every figure)", metavar="FILE")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.output.parent, args.allow_dirty, name=f"{args.output.stem}.uncommitted.diff")
    from dataclasses import asdict

    from effrag.pipelines.efficientrag.config import EfficientRAGConfig

    skip = []
    if not args.keep_sample:
        from effrag.data import sample_question_ids

        skip = sample_question_ids(args.datasets)
    head = ["lever", *(f"{d} <= {b}" for d in args.datasets for b in args.budgets), "read per question (L / R / F)"]
    body, figures = [], {}
    defaults = asdict(EfficientRAGConfig())  # a tuning row leaves out options at their defaults
    for spec in args.row:
        label, template, want = parse_row(spec)
        cells, read = [], []
        for d in args.datasets:
            rows = [r for r in read_rows(template.format(dataset=d))  # an option left out is at its default
                    if all(r["config"].get(k, defaults.get(k)) == v for k, v in want.items())]
            if not rows:
                raise SystemExit(f"--row {label!r}: no config of {template.format(dataset=d)} has {want}")
            res = crossfit({d: rows}, args.budgets, k=args.folds, exclude=skip)["datasets"][d]
            figures[f"{label}/{d}"] = res
            cells += [f"{100 * res['recall'][b]:.1f}" for b in args.budgets]
            read.append("/".join(f"{x:.0f}" for x in res["forwards"]))
        body.append([label, *cells, ", ".join(read)])
    table = md_table(head, body, "l" + "r" * (len(head) - 2) + "l")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    note = (f"Recall %, cross-fitted ({args.folds} folds) within each row's grid; questions: every dev question"
            f"{'' if args.keep_sample else ' except the bundled sample' + chr(39) + 's'}. Commit {commit}.\n\n")
    args.output.write_text(note + table + "\n")
    args.output.with_suffix(".json").write_text(json.dumps(figures, indent=1, default=str))
    print(note + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
