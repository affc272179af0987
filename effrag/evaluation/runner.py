"""Run a pipeline over questions and write predictions, metrics and the run config.

Output folder:
- ``predictions.jsonl``: one row per question, appended and flushed as it finishes,
  so a killed run (hours of LLM calls) resumes where it stopped; a row is the question's
  ``qid``, ``dataset``, ``question``, ``gold``, ``answers`` and ``latency_s``, then the method's
  :meth:`Result.to_row() <effrag.pipelines.result.Result.to_row>` fields (:mod:`.predictions` writes and
  reads them);
- ``metrics.json`` / ``metrics.md``: aggregates, one entry per k for methods whose
  rankings nest (``pipeline.slice_k``), else one entry;
- ``config.json``: the run config, package versions and seed.
"""
from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from effrag.pipelines.result import Result
from effrag.state_files import write_text_atomic

from .metrics import answer_rule, cover_em, exact_match, f1, recall
from .predictions import write_row
from .report import write_metrics_md

log = logging.getLogger(__name__)

# Config keys that may change between a run and its resumption.
RESUMABLE_KEYS = {"limit", "output", "batch_size", "overwrite", "show_progress", "versions", "started"}


def set_seed(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:  # seed torch only for methods that use it (importing it costs seconds)
        sys.modules["torch"].manual_seed(seed)


def _check_resume(out: Path, config: dict) -> None:
    """A folder's predictions resume only under the same run config (:func:`effrag.setup.check_same_run`)."""
    from effrag.setup import check_same_run

    cfg_path = out / "config.json"
    if not cfg_path.is_file():
        return
    try:
        old = json.loads(cfg_path.read_text(encoding="utf-8")).get("run", {})
    except (UnicodeDecodeError, ValueError, AttributeError) as e:
        raise ValueError(f"{cfg_path}: unreadable ({' '.join(str(e).split())}); delete the output folder's files "
                         "or use --overwrite") from None
    check_same_run(old, config, out, what="predictions", may_change=RESUMABLE_KEYS,
                   hint="use another output folder or --overwrite")


def aggregate(rows: list[dict], k: int | None, method: str, dataset: str, cut_at_k: bool) -> dict[str, Any]:
    """The metric entry of ``predictions.jsonl`` rows; ``cut_at_k`` scores each ranking's first ``k`` chunks."""
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else None

    cut = (lambda r: r["retrieved"][:k]) if cut_at_k else (lambda r: r["retrieved"])
    with_gold = [r for r in rows if r["gold"]]
    entry: dict[str, Any] = {
        "method": method, "dataset": dataset, "n": len(rows), "k": k,
        "recall": mean(recall(cut(r), r["gold"]) for r in with_gold), "n_with_gold": len(with_gold),
        "avg_chunks": mean(len(cut(r)) for r in rows),
        "latency_s": mean(r["latency_s"] for r in rows),
    }
    if any("answer" in r for r in rows):
        entry["em"] = mean(exact_match(r.get("answer", ""), r["answers"]) for r in rows)
        entry["answer_rule"] = rule = answer_rule(dataset)  # the dataset's official F1 rule
        entry["f1"] = mean(f1(r.get("answer", ""), r["answers"], rule) for r in rows)
        entry["cover_em"] = mean(cover_em(r.get("answer", ""), r["answers"]) for r in rows)
    for key in ("llm_calls", "prompt_tokens", "completion_tokens", "iterations"):
        entry[key] = mean(r.get(key, 0) for r in rows)
    return entry


def _warm_retriever(pipeline) -> None:
    """Load the dense encoder of the pipeline's retriever (or of a hybrid's parts) before the clock starts: it loads
    on its first query (e5-small: 0.5 GB hashed and read), which would otherwise count in the first batch's
    ``latency_s``. Nothing is searched, so no result changes."""
    retriever = getattr(pipeline, "retriever", None)
    for r in (retriever, *getattr(retriever, "retrievers", ())):
        encoder = getattr(r, "encoder", None)
        if callable(getattr(encoder, "load", None)):
            encoder.load()


def evaluate(pipeline, questions: Sequence, gold_ids: Sequence[list[str]], output_dir: str | Path,
             config: dict[str, Any], *, ks: Sequence[int] | None = None, batch_size: int = 1,
             seed: int = 0, show_progress: bool = True) -> list[dict[str, Any]]:
    """Run ``pipeline`` on ``questions`` (records with ``id``, ``question``, ``answers``, ``dataset``).

    ``gold_ids[i]`` are the corpus ids of question i's gold passages. ``latency_s`` is
    the wall time of the pipeline call divided by the batch size (``batch_size=1``
    gives true per-question latency). Returns the metric entries written to ``metrics.json``.
    """
    from tqdm.auto import tqdm

    from effrag.jsonl import ResultLog
    from effrag.provenance import package_versions

    if len(gold_ids) != len(questions):
        raise ValueError(f"{len(questions)} questions but {len(gold_ids)} gold id lists")
    if not questions:
        raise ValueError("no questions to evaluate")
    if ks and len(ks) > 1 and not getattr(pipeline, "slice_k", False):
        raise ValueError(f"method {pipeline.name!r} cannot be scored at several k from one run; give one k")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_resume(out, config)
    set_seed(seed)
    write_text_atomic(out / "config.json", json.dumps(
        {"run": config, "seed": seed, "ks": list(ks) if ks else None, "versions": package_versions(),
         "started": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2, default=str))

    pred_path = out / "predictions.jsonl"
    # one row per finished question (flushed and fsynced per batch): a killed run resumes where it stopped
    done = ResultLog(pred_path, key=lambda row: row["qid"], hint="delete the file or use another output")
    todo = [(q, g) for q, g in zip(questions, gold_ids) if q.id not in done]
    if len(done):
        log.info("resuming: %d of %d questions already in %s", len(questions) - len(todo), len(questions), pred_path)
    if todo:
        _warm_retriever(pipeline)
    with done, tqdm(total=len(questions), initial=len(questions) - len(todo), desc=f"eval {pipeline.name}",
                    unit="q", disable=not show_progress) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            t0 = time.perf_counter()
            results = pipeline.run_batch([q.question for q, _ in batch])
            per_q = (time.perf_counter() - t0) / len(batch)
            rows = []
            for (q, gold), res in zip(batch, results):
                if not isinstance(res, Result):
                    raise TypeError(f"method {pipeline.name!r} returned a {type(res).__name__}; a pipeline returns "
                                    "effrag.pipelines.Result objects")
                rows.append(write_row(q, gold, res, per_q))
            done.extend(rows)
            bar.update(len(batch))

    rows = [done.get(q.id) for q in questions]
    dataset = config.get("dataset") or questions[0].dataset
    sliced = bool(ks) and getattr(pipeline, "slice_k", False)
    # Iterative methods use k per hop: their whole retrieved list counts, whatever its length.
    k_list = sorted(set(ks)) if sliced else [max(ks) if ks else None]
    entries = [aggregate(rows, k, pipeline.name, dataset, cut_at_k=sliced) for k in k_list]
    if config.get("retriever"):
        for e in entries:
            e["retriever"] = config["retriever"]
    if sliced and len(k_list) > 1:
        for e in entries:  # one retrieval at the largest k served every row: say so
            e["latency_measured_at_k"] = max(k_list)
    write_text_atomic(out / "metrics.json", json.dumps(entries, indent=2))
    write_metrics_md(entries, out / "metrics.md")
    return entries
