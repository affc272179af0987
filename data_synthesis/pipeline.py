"""The synthesis run: dataset files in, Labeler / Filter JSONL out (docs/design.md formats).

:func:`synthesize` loads every input file (HotpotQA, 2WikiMQA and MuSiQue may be
pooled into one output), makes each question's records with the annotation path
(:mod:`data_synthesis.annotation`) or the LLM path (:mod:`data_synthesis.llm_steps`),
adds hard negatives (:mod:`data_synthesis.negatives`) with one batched search per
batch of questions, and appends each finished question through
:class:`~effrag.jsonl.ResumableWriter`, so a rerun of the same command resumes.

A bad question never stops the run: it becomes a line of ``rejects.jsonl`` with its
stage and reason. Only failures that are not the question's fault (the LLM backend
or the retriever being unavailable) stop it; rerunning then continues where it was.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from effrag.data import load_questions
from effrag.data.records import Question
from effrag.jsonl import ResumableWriter

from .annotation import AnnotationReject, annotate_question
from .stats import format_table, write_stats

log = logging.getLogger(__name__)
SOURCES = ("annotation", "llm")
_RESUME_KEYS = ("source", "retriever", "negatives", "neg_k", "per_query", "context_negatives",
                "skip_answer_negatives")


def load_inputs(inputs: Sequence[str | Path], limit: int | None = None) -> tuple[list[Question], list[dict]]:
    """Questions of every input (``limit`` per file) and reject lines for malformed records."""
    questions: list[Question] = []
    rejects: list[dict] = []
    for path in inputs:
        qs, rep = load_questions(path, skip_malformed=True, limit=limit, report=True)
        questions += qs
        for msg in rep.errors:  # "<path>:<line>: field ...": the location stands in for the qid
            where = msg.split(": ", 1)[0]
            rejects.append({"qid": where, "dataset": rep.dataset or "unknown", "stage": "load",
                            "reason": "malformed_record", "detail": msg[:300]})
    return questions, rejects


def make_retriever(kind: str, corpus_paths: Sequence[str | Path], *, cache_dir: str | Path | None = None,
                   encoder_path: str | None = None, bf16: bool = False, show_progress: bool = True):
    """The foundation retriever over the contexts of ``corpus_paths`` (dense indexes cached when ``cache_dir`` is
    given), through the run-setup layer; a malformed record is a reject, not a stop."""
    from effrag.setup import RunSetup

    return RunSetup.build(corpus_from=list(corpus_paths), retriever=kind, skip_malformed=True,
                          cache=kind != "bm25" and cache_dir is not None, cache_dir=cache_dir, encoder=encoder_path,
                          bf16=bf16, retriever_options={"show_progress": show_progress}).retriever


def _reject(q: Question, stage: str, reason: str, detail: str = "") -> dict:
    r = {"qid": q.id, "dataset": q.dataset, "stage": stage, "reason": reason}
    return {**r, "detail": detail[:300]} if detail else r


def _records_for(q: Question, source: str, llm) -> dict[str, Any]:
    """One question's records; a failure of the question becomes its reject."""
    try:
        if source == "annotation":
            a = annotate_question(q)
            lab, fil, notes = a.labeler, a.filters, dict(a.notes)
            rejects = [_reject(q, r["stage"], r["reason"]) for r in a.rejects]
        else:
            from .llm_steps import synthesize_question_llm

            lab, fil = synthesize_question_llm(q, llm)
            notes, rejects = {}, []
    except AnnotationReject as e:
        return {"status": "rejected", "rejects": [_reject(q, "annotate", e.reason, e.detail)]}
    except Exception as e:  # noqa: BLE001 - one bad item must not stop the run ...
        from effrag.llm import LLMError

        if isinstance(e, LLMError):  # ... but a broken backend is not the item's fault
            raise
        from .llm_steps import SynthesisReject

        if isinstance(e, SynthesisReject):
            return {"status": "rejected", "rejects": [_reject(q, "llm", e.reason, e.detail)]}
        log.warning("question %s/%s failed: %r", q.dataset, q.id, e)
        return {"status": "rejected", "rejects": [_reject(q, source, f"error:{type(e).__name__}", str(e))]}
    if not lab:
        return {"status": "rejected", "rejects": rejects + [_reject(q, source, "no_records")], "notes": notes}
    return {"status": "ok", "labeler": lab, "filters": fil, "rejects": rejects, "notes": notes}


def _check_config(out: Path, config: dict[str, Any]) -> None:
    """Refuse to resume into a directory made with different settings (:func:`effrag.setup.check_same_run`); log
    this run. More inputs, another limit or LLM may join a run (their records are added)."""
    from effrag.setup import check_same_run

    path = out / "config.json"
    from effrag.state_files import read_json, write_json_atomic

    runs = read_json(path, "use a new --output directory")["runs"] if path.exists() else []
    compared = lambda run: {k: run.get(k) for k in _RESUME_KEYS}  # noqa: E731
    check_same_run(compared(runs[0]) if runs else None, compared(config), out, what="synthesis output",
                   hint="it was made with other settings: use a new --output directory or the same settings")
    runs.append(config)
    write_json_atomic(path, {"runs": runs}, indent=2)


def synthesize(inputs: Sequence[str | Path], out_dir: str | Path, source: str = "annotation", llm=None,
               retriever: Any = "bm25", negatives: bool = True, limit: int | None = None, *,
               corpus_from: Sequence[str | Path] | None = None, batch_size: int | None = None,
               neg_k: int = 10, per_query: int = 1, cache_dir: str | Path | None = None,
               encoder_path: str | None = None, bf16: bool = False, show_progress: bool = True,
               output_format: str = "jsonl", context_negatives: int = 0,
               skip_answer_negatives: bool = False) -> dict[str, Any]:
    """Synthesize training data from ``inputs`` into ``out_dir``; returns the run summary.

    ``retriever`` is a kind (``"bm25"``, ``"dense"``, ``"hybrid"``) built over the
    contexts of ``corpus_from`` (default: the inputs), or a ready retriever object.
    ``limit`` caps the questions taken from each input file. ``output_format``: ``jsonl`` (the
    record files), ``arrow`` (a ``DatasetDict`` in ``out_dir/dataset``; the JSONL record files are
    only the crash-safe log, emptied once exported) or ``both`` (:mod:`data_synthesis.export`).
    ``context_negatives`` adds up to that many of each question's own distractor paragraphs as
    negatives under the question (:func:`~data_synthesis.negatives.context_negatives`; 0 = none).
    ``skip_answer_negatives`` passes over a mined hit that states the question's answer
    (:func:`~data_synthesis.negatives.mine_negatives`).
    """
    from .export import FORMATS, export_arrow

    if output_format not in FORMATS:
        raise ValueError(f"unknown output format {output_format!r}; expected one of {', '.join(FORMATS)}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")
    if context_negatives < 0:
        raise ValueError(f"context_negatives must be >= 0, got {context_negatives}")
    if source == "llm" and llm is None:
        raise ValueError("source 'llm' needs an LLM (--llm SPEC)")
    start = time.time()
    questions, load_rejects = load_inputs(inputs, limit)
    if not questions:  # nothing to train on is an error, not an empty success
        bad = f" ({len(load_rejects)} malformed record(s), e.g. {load_rejects[0]['detail']})" if load_rejects else ""
        raise ValueError(f"no usable questions in {', '.join(str(p) for p in inputs)}{bad}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kind = retriever if isinstance(retriever, str) else type(retriever).__name__
    _check_config(out, {
        "source": source, "retriever": kind if negatives else None, "negatives": negatives,
        "neg_k": neg_k if negatives else None, "per_query": per_query if negatives else None,
        "context_negatives": context_negatives or None,  # None when off: directories made before it resume
        "skip_answer_negatives": (skip_answer_negatives and negatives) or None,  # None when off, as before it existed
        "inputs": [str(Path(p).resolve()) for p in inputs],
        "corpus_from": [str(Path(p).resolve()) for p in (corpus_from or inputs)], "limit": limit,
        "llm": getattr(llm, "model_id", None) if llm is not None else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
    batch_size = batch_size or (64 if source == "annotation" else 1)
    summary: Counter = Counter()
    with ResumableWriter(out) as writer:
        if any(writer.recovered.values()):
            log.warning("recovered %s: %s", out, writer.recovered)
        for r in load_rejects:
            if not writer.is_done(r["dataset"], r["qid"]):
                writer.write_item(r["dataset"], r["qid"], rejects=[r], status="rejected")
                summary["malformed"] += 1
        todo = [q for q in questions if not writer.is_done(q.dataset, q.id)]
        summary["skipped_done"] = len(questions) - len(todo)
        if negatives and todo and isinstance(retriever, str):
            retriever = make_retriever(retriever, corpus_from or inputs, cache_dir=cache_dir, bf16=bf16,
                                       encoder_path=encoder_path, show_progress=show_progress)
        cache0 = llm.usage.cache_hits if llm is not None and hasattr(llm, "usage") else 0
        bar = tqdm(total=len(todo), unit="q", desc=f"synthesize[{source}]", dynamic_ncols=True,
                   disable=not show_progress)
        for b in range(0, len(todo), batch_size):
            batch = todo[b:b + batch_size]
            results = [_records_for(q, source, llm) for q in batch]
            if negatives:
                from .negatives import mine_negatives

                ok = [(q, r) for q, r in zip(batch, results) if r["status"] == "ok"]
                negs = mine_negatives([(q, r["filters"]) for q, r in ok], retriever, k=neg_k,
                                      per_query=per_query, source=source, skip_answer=skip_answer_negatives)
                for (q, r), neg in zip(ok, negs):
                    r["labeler"] = r["labeler"] + neg
                    summary["negatives"] += len(neg)
            if context_negatives:
                from .negatives import context_negatives as own_distractors

                for q, r in zip(batch, results):
                    if r["status"] == "ok":
                        taken = {x["chunk_id"] for x in r["labeler"] if x["tag"] == 0 and x["query"] == q.question}
                        neg = own_distractors(q, context_negatives, exclude=taken, source=source)
                        r["labeler"] = r["labeler"] + neg
                        summary["context_negatives"] += len(neg)
            for q, r in zip(batch, results):
                writer.write_item(q.dataset, q.id, labeler=r.get("labeler", []), filters=r.get("filters", []),
                                  rejects=r["rejects"], status=r["status"], notes=r.get("notes"))
                summary[r["status"]] += 1
                summary["labeler"] += len(r.get("labeler", []))
                summary["filter"] += len(r.get("filters", []))
            postfix = {"ok": summary["ok"], "rej": summary["rejected"], "lab": summary["labeler"],
                       "filt": summary["filter"]}
            if llm is not None and hasattr(llm, "usage"):
                summary["cache_hits"] = llm.usage.cache_hits - cache0
                postfix["cache"] = summary["cache_hits"]
            bar.set_postfix(postfix)
            bar.update(len(batch))
        bar.close()
    stats = write_stats(out)
    result = {"questions": len(questions), **dict(summary), "seconds": round(time.time() - start, 1),
              "recovered": writer.recovered, "output": str(out)}
    if output_format != "jsonl":
        result["dataset_rows"] = export_arrow(out, keep_jsonl=output_format == "both", progress=show_progress)
        result["dataset"] = str(out / "dataset")
    if show_progress:
        print(format_table(stats))
        print("run: " + ", ".join(f"{k}={v}" for k, v in result.items() if k != "output"))
    return result
