"""A ``predictions.jsonl`` row, written and read in one place: the question's facts and the method's result.

A row is ``{"qid", "dataset", "question", "gold", "answers", "latency_s", **result.to_row()}``
(:meth:`effrag.pipelines.Result.to_row`). The runner writes rows with :func:`write_row`; reports, benchmarks and
the quickstart read them back with :func:`read_predictions`, each as a :class:`Prediction` holding a typed
:class:`~effrag.pipelines.Result` (its ``hops``, ``generation``, ``extra``), so no caller parses a row by hand.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effrag.pipelines.result import Result

QUESTION_FIELDS = ("qid", "dataset", "question", "gold", "answers", "latency_s")


@dataclass
class Prediction:
    """One question of a run: what was asked (``qid``, ``dataset``, ``gold`` corpus ids, ``answers``), how long
    the method took for it, and its :class:`~effrag.pipelines.Result`."""

    qid: str
    dataset: str
    question: str
    gold: list[str]
    answers: list[str]
    latency_s: float
    result: Result

    def to_row(self) -> dict[str, Any]:
        return write_row(self, self.gold, self.result, self.latency_s)

    @classmethod
    def from_row(cls, row: dict[str, Any], where: str = "predictions row") -> Prediction:
        """A row read back; a row without the question fields is one error naming ``where`` and the field."""
        missing = [k for k in QUESTION_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{where}: not a predictions row (no {', '.join(missing)})")
        try:
            result = Result.from_row(row)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return cls(str(row["qid"]), row["dataset"], row["question"], list(row["gold"]), list(row["answers"]),
                   float(row["latency_s"]), result)


def write_row(question: Any, gold: Sequence[str], result: Result, latency_s: float) -> dict[str, Any]:
    """The row of ``question`` (a :class:`~effrag.data.Question` or a :class:`Prediction`: ``id``/``qid``,
    ``dataset``, ``question``, ``answers``) answered by ``result`` in ``latency_s`` seconds."""
    qid = question.qid if isinstance(question, Prediction) else question.id
    return {"qid": qid, "dataset": question.dataset, "question": question.question, "gold": list(gold),
            "answers": list(question.answers), "latency_s": latency_s, **result.to_row()}


def read_predictions(path: str | Path, *, method: str | None = None) -> list[Prediction]:
    """The rows of ``predictions.jsonl`` (or of a run folder holding it). With ``method``, the run's
    ``config.json`` (when beside the file) must name that method: a report of one method is never fed another's
    rows. A bad line is one error naming the file and line."""
    from effrag.jsonl import numbered_jsonl

    path = Path(path)
    path = path / "predictions.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no predictions (an `effrag eval` output folder holds predictions.jsonl)")
    if method is not None:
        recorded = run_method(path.parent)
        if recorded is not None and recorded != method:
            raise ValueError(f"{path.parent / 'config.json'}: a {recorded} run, not {method}")
    return [Prediction.from_row(row, f"{path}:{n}") for n, row in numbered_jsonl(path)]


def run_method(folder: str | Path) -> str | None:
    """The method a run folder's ``config.json`` records (None without one)."""
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return None
    try:
        return (json.loads(cfg.read_text(encoding="utf-8")).get("run") or {}).get("method")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{cfg}: unreadable run config ({e})") from None
