"""2WikiMultihopQA v1.1 answer aliases (``id_aliases.json``).

The v1.1 release of 2WikiMultihopQA ships an alias file with one JSON object per
line, ``{"Q_id": "Q...", "aliases": [...], "demonyms": [...]}``, and each question
names its answer's Wikidata id in ``answer_id``. The official evaluation script
(``2wikimultihop_evaluate_v1.1.py``) scores a prediction against the gold answer
*and* every alias and demonym of ``answer_id`` (EM/F1 take the max). Here that
is :func:`load_answer_aliases` + :func:`apply_answer_aliases`, which append those
strings to each 2Wiki question's ``answers`` (the gold answer stays first), so
every metric in :mod:`effrag.evaluation.metrics` sees them; without an alias file
nothing changes. As in the official script, a later line for the same ``Q_id``
replaces an earlier one, and a question whose ``answer_id`` is not in the file
keeps its answer alone.

On the command line: ``effrag eval --aliases id_aliases.json`` (see
:func:`add_answer_alias_args` / :func:`apply_aliases`).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import MutableSequence
from dataclasses import replace
from pathlib import Path

from .loaders import DataFormatError, _records
from .records import Question

ALIAS_DATASETS = ("2wikimqa",)


def load_answer_aliases(path: str | Path) -> dict[str, list[str]]:
    """``Q_id -> aliases + demonyms`` (file order, duplicates and blanks dropped) of an alias file.

    Reads JSON Lines (the official format) or a JSON array of the same objects. A record
    without a string ``Q_id``, or whose ``aliases``/``demonyms`` is not a list of strings,
    is a :class:`~effrag.data.DataFormatError` naming the file and line; a missing
    ``demonyms`` (or ``aliases``) counts as empty.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"alias file not found: {path}")
    out: dict[str, list[str]] = {}
    for where, rec in _records(path):
        if isinstance(rec, DataFormatError):
            raise rec
        if not isinstance(rec, dict):
            raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        qid = rec.get("Q_id")
        if not isinstance(qid, str) or not qid:
            raise DataFormatError(f"{where}: field 'Q_id': "
                                  + ("missing" if "Q_id" not in rec else "expected a non-empty string")
                                  + " (is this a 2WikiMultihopQA id_aliases.json?)")
        names: list[str] = []
        for key in ("aliases", "demonyms"):
            values = rec.get(key) or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise DataFormatError(f"{where}: field '{key}': expected a list of strings")
            for v in values:
                v = v.strip()
                if v and v not in names:
                    names.append(v)
        out[qid] = names
    if not out:
        raise DataFormatError(f"{path}: empty alias file (no records)")
    return out


def apply_answer_aliases(questions: MutableSequence[Question], aliases: dict[str, list[str]]) -> int:
    """Append the aliases of each 2Wiki question's ``answer_id`` to its ``answers``; returns how many
    questions got at least one new answer.

    List items are replaced by updated copies (the :class:`Question` objects themselves are not
    changed). Raises ValueError when no question can take aliases (no 2Wiki question with an
    ``answer_id``): an alias file given for another dataset is a mistake, not a no-op.
    """
    eligible = extended = 0
    for i, q in enumerate(questions):
        if q.dataset not in ALIAS_DATASETS or not q.answer_id:
            continue
        eligible += 1
        new = [a for a in aliases.get(q.answer_id, []) if a not in q.answers]
        if new:
            questions[i] = replace(q, answers=[*q.answers, *new])
            extended += 1
    if not eligible:
        datasets = sorted({q.dataset for q in questions})
        raise ValueError(
            "answer aliases apply to 2WikiMultihopQA questions with an 'answer_id' (v1.1 files); "
            f"none among these {len(questions)} question(s) ({', '.join(datasets) or 'none'})")
    return extended


# ---------------------------------------------------------------- CLI

def add_answer_alias_args(p: argparse.ArgumentParser) -> None:
    """``--aliases FILE`` (dest ``answer_aliases``)."""
    p.add_argument("--aliases", dest="answer_aliases", metavar="FILE", default=None,
                   help="2WikiMultihopQA v1.1 id_aliases.json: score answers against the gold answer and "
                        "the aliases and demonyms of its answer_id, like the official v1.1 script")


def apply_aliases(args: argparse.Namespace, questions: MutableSequence[Question]) -> str | None:
    """Apply ``args.answer_aliases`` (if given) to ``questions`` in place; returns the resolved path to
    record in the run config (None without an alias file) and notes on stderr how many questions it changed."""
    path = getattr(args, "answer_aliases", None)
    if not path:
        return None
    extended = apply_answer_aliases(questions, load_answer_aliases(path))
    print(f"effrag: note: answer aliases from {path}: {extended} of {len(questions)} question(s) "
          "got extra gold answers", file=sys.stderr)
    return str(Path(path).resolve())
