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

Records come from ``effrag synthesize --source annotation`` on a dev file (``labeler.jsonl``); the question of a
record is the query of its question's hop-1 records. Writes ``breakdown.md`` / ``breakdown.json`` (with provenance)
to ``--output``:

    for d in hotpotqa 2wikimqa musique; do
      effrag synthesize --inputs ../shared/data/$d/dev.jsonl --output runs/synth/dev_$d --source annotation --quiet
    done
    python scripts/labeler_breakdown.py --labeler effrag/pretrained/efficientrag-all/labeler \\
        --records runs/synth/dev_hotpotqa/labeler.jsonl runs/synth/dev_2wikimqa/labeler.jsonl \\
        runs/synth/dev_musique/labeler.jsonl --output reports/efficientrag/labeler-breakdown

Without ``--labeler`` it only counts the records of each kind: the composition of a training file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def record_kind(rec: dict, question: str | None) -> str:
    """The row of the table a labeler record belongs to (see the module docstring)."""
    if not rec.get("tag"):
        return "negative"
    hop = int(rec.get("hop", 1))
    hop_name = "hop 1" if hop == 1 else "hop 2" if hop == 2 else "hop 3+"
    under = "the question" if rec["query"] == question else "another query" if hop == 1 else "its query"
    return f"gold, {hop_name}, under {under}"


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"labeler_breakdown: error: {path}: no such file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["query"], rec["chunk_words"], rec["qid"]  # noqa: B018 - the fields this script reads
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SystemExit(f"labeler_breakdown: error: {path}:{n}: not a labeler record ({e})")
        out.append(rec)
    if not out:
        raise SystemExit(f"labeler_breakdown: error: {path}: no records")
    return out


def breakdown(records: list[dict], p_continue: list[float] | None = None) -> list[dict]:
    """One row per record kind: n, accuracy at 0.5, mean p(<Continue>) (``None`` without predictions: the
    training data's composition)."""
    questions = {r["qid"]: r["query"] for r in records if int(r.get("hop", 1)) == 1 and r.get("tag")}
    groups: dict[str, list[tuple[float | None, int]]] = defaultdict(list)
    for r, p in zip(records, p_continue or [None] * len(records)):
        groups[record_kind(r, questions.get(r["qid"]))].append((p, int(bool(r.get("tag")))))
    rows = []
    for kind in sorted(groups, key=lambda k: (k != "negative", k)):
        v = groups[kind]
        scored = p_continue is not None
        rows.append({"kind": kind, "n": len(v),
                     "accuracy": sum((p > 0.5) == bool(t) for p, t in v) / len(v) if scored else None,
                     "mean_p_continue": sum(p for p, _ in v) / len(v) if scored else None})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labeler", help="Labeler checkpoint directory; without it, only the records per kind are "
                                      "counted (e.g. a train file's composition)")
    ap.add_argument("--records", nargs="+", required=True, type=Path, help="synthesized labeler.jsonl files")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--output", required=True, type=Path)
    args = ap.parse_args(argv)
    from effrag.evaluation.report import md_table
    from effrag.models import load_model
    from effrag.provenance import provenance

    data = {str(f): read_records(f) for f in args.records}  # bad input fails before the model loads
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
         **provenance(prog="python scripts/labeler_breakdown.py", files=[str(f) for f in args.records])}, indent=2))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
