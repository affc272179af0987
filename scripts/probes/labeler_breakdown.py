#!/usr/bin/env python
"""Where does the Labeler's <Continue>/<Terminate> tag fail? Its accuracy by kind of (query, chunk) record.

The training loop reports one tag accuracy per dataset (MuSiQue 0.58 against 2Wiki 0.95 for the shipped
Labeler). This splits it by what the loop asks of the Labeler:

* ``negative``: a non-gold chunk (tag 0), as mined by synthesis;
* ``gold, hop 1, under the question``: a first-hop gold chunk under the question itself;
* ``gold, hop h, under its query``: a later-hop gold chunk under the oracle next-hop query (the Filter's
  target): what the loop sees when its Filter writes the right query;
* ``gold, hop h, under the question``: a later-hop gold chunk under the original question: what the loop sees
  when hop 0 already retrieved it (the pool ranks these chunks by this score).

The kinds and their counting are :mod:`effrag.evaluation.labeler_breakdown`. Records come from ``effrag
synthesize --source annotation`` on a dev file (``labeler.jsonl``); the question of a record is the query of its
question's hop-1 records. Writes ``breakdown.md`` / ``breakdown.json`` (with provenance) to ``--output``:

    for d in hotpotqa 2wikimqa musique; do
      effrag synthesize --inputs ../shared/data/$d/dev.jsonl --output runs/synth/dev_$d --source annotation --quiet
    done
    python scripts/probes/labeler_breakdown.py --labeler effrag/pretrained/efficientrag-all/labeler \\
        --records runs/synth/dev_hotpotqa/labeler.jsonl runs/synth/dev_2wikimqa/labeler.jsonl \\
        runs/synth/dev_musique/labeler.jsonl --output reports/archive/efficientrag/labeler-breakdown

Without ``--labeler`` it only counts the records of each kind: the composition of a training file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def read_records(path: Path) -> list[dict]:
    from effrag.evaluation.labeler_breakdown import read_records as read

    try:
        return read(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"labeler_breakdown: error: {e}") from None


def main(argv=None) -> int:
    from effrag.cli_args import add_batch_size_arg, add_output_arg, add_source_args
    from effrag.provenance import provenance, report_source

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labeler", help="Labeler checkpoint directory; without it, only the records per kind are "
                                      "counted (e.g. a train file's composition)")
    ap.add_argument("--records", nargs="+", required=True, type=Path, help="synthesized labeler.jsonl files")
    add_batch_size_arg(ap, 32, of="(query, chunk) records per Labeler forward pass")
    add_output_arg(ap, required=True, help="folder breakdown.md and breakdown.json are written to")
    add_source_args(ap)
    args = ap.parse_args(argv)
    data = {str(f): read_records(f) for f in args.records}  # bad input fails before the model loads
    commit = report_source(args.output, args.allow_dirty)  # and so does a dirty tree
    from effrag.evaluation.labeler_breakdown import breakdown
    from effrag.evaluation.report import md_table
    from effrag.models import load_model

    model = load_model(args.labeler) if args.labeler else None
    table = []
    for f, records in data.items():
        dataset = records[0].get("dataset", Path(f).parent.name)
        print(f"{dataset}: {len(records)} records", file=sys.stderr)
        preds = model and model.predict([r["query"] for r in records], [r["chunk_words"] for r in records],
                                        batch_size=args.batch_size)
        table += [{"dataset": dataset, **row} for row in breakdown(records, preds and [p for p, _ in preds])]
    args.output.mkdir(parents=True, exist_ok=True)
    cols = ["dataset", "kind", "n", "accuracy", "mean_p_continue"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    md = md_table(cols, [[r["dataset"], r["kind"], str(r["n"]), fmt(r["accuracy"]), fmt(r["mean_p_continue"])]
                         for r in table]) + "\n"
    (args.output / "breakdown.md").write_text(md)
    (args.output / "breakdown.json").write_text(json.dumps(
        {"rows": table, "labeler": args.labeler,
         **provenance(prog="python scripts/probes/labeler_breakdown.py", files=[str(f) for f in args.records], commit=commit)},
        indent=2))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
