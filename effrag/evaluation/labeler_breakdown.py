"""The Labeler's <Continue>/<Terminate> accuracy by kind of (query, chunk) record (``scripts/probes/labeler_breakdown.py``).

* ``negative``: a non-gold chunk (tag 0), as mined by synthesis;
* ``gold, hop 1, under the question``: a first-hop gold chunk under the question itself;
* ``gold, hop h, under its query``: a later-hop gold chunk under the oracle next-hop query (the Filter's
  target): what the loop sees when its Filter writes the right query;
* ``gold, hop h, under the question``: a later-hop gold chunk under the original question: what the loop sees
  when hop 0 already retrieved it (the pool ranks these chunks by this score).

The question of a record is the query of its question's hop-1 records.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def record_kind(rec: dict, question: str | None) -> str:
    """The row of the table a labeler record belongs to (see the module docstring)."""
    if not rec.get("tag"):
        return "negative"
    hop = int(rec.get("hop", 1))
    hop_name = "hop 1" if hop == 1 else "hop 2" if hop == 2 else "hop 3+"
    under = "the question" if rec["query"] == question else "another query" if hop == 1 else "its query"
    return f"gold, {hop_name}, under {under}"


def read_records(path: Path) -> list[dict]:
    """The records of a synthesized ``labeler.jsonl``; ValueError naming the file (and line) when it has none or
    a line is not a labeler record, FileNotFoundError when it is not there."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["query"], rec["chunk_words"], rec["qid"]  # noqa: B018 - the fields the breakdown reads
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a labeler record ({e})") from None
        out.append(rec)
    if not out:
        raise ValueError(f"{path}: no records")
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
