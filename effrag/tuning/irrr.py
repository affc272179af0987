"""IRRR's query-word and answerability thresholds, tuned on dev questions (the paper tunes them on dev for QA).

The answerability threshold only decides *when* the loop stops, and the path it grows does not depend on it,
so each (query threshold, first-step depth) is run once with no stopping (to ``max_path``) and every
answerability threshold is replayed from the per-step hops (:func:`replay`): the first step whose best
answerability reaches it gives the answer and the returned paragraphs (filled up to ``return_k`` when given,
in each fill order replayed). The objective is mean F1 or mean recall of gold paragraphs over datasets; ties:
fewer paragraphs read. :func:`tune_irrr` writes ``grid.json``, ``table.md`` and ``best.json`` (an
``--irrr-config`` for ``scripts/bench_irrr.py`` and ``scripts/bench_qa.py``); ``scripts/tune_irrr.py`` is its
command line.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..state_files import write_text_atomic


def replay(steps: list[dict], threshold: float, return_k: int | None = None,
           fill_order: str = "rerank") -> tuple[str, list[str], int, int]:
    """(answer, returned ids, steps taken, paragraphs read) had the loop stopped at ``threshold``."""
    from effrag.pipelines.irrr import outcome

    read = 0
    for i, s in enumerate(steps):
        read += len(s["candidates"])
        if s.get("best") and s["best"]["answerability"] >= threshold:
            stop = {**{k: v for k, v in s.items() if k != "appended"}, "stop": "answerable"}  # as the loop would
            o = outcome(steps[:i] + [stop], return_k, fill_order)
            return o["answer"], o["retrieved"], i + 1, read
    o = outcome([{k: v for k, v in s.items() if k != "stop"} for s in steps], return_k, fill_order)
    return o["answer"], o["retrieved"], len(steps), read


def runs_to_cap(model, data: str | Path, datasets: Sequence[str], output: Path, *, limit: int | None,
                query_thresholds: Sequence[float], first_ks: Sequence[int | None], k: int,
                max_path: int) -> dict[tuple, dict[str, list[dict]]]:
    """Per (query threshold, first-step depth) and dataset: each dev question's steps run to the path cap, kept
    one row per question in ``output`` as it finishes (a killed tuning run resumes mid-dataset)."""
    from effrag.data import load_questions
    from effrag.jsonl import ResultLog
    from effrag.pipelines.irrr import IRRRConfig, IRRRRunner
    from effrag.setup import RunSetup, dataset_file

    runs: dict[tuple, dict[str, list[dict]]] = {}
    setups: dict[str, RunSetup] = {}
    for qt in query_thresholds:
        for fk in first_ks:
            runs[qt, fk] = {}
            for ds in datasets:
                dev = dataset_file(data, ds, "dev")
                questions = load_questions(dev, limit=limit)
                name = f"runs_q{qt}_{ds}.jsonl" if fk is None else f"runs_q{qt}_fk{fk}_k{k}_{ds}.jsonl"
                with ResultLog(output / name, key=lambda r: r["qid"]) as log:
                    if any(q.id not in log for q in questions):
                        if ds not in setups:
                            setups[ds] = RunSetup.build(questions, corpus_from=[dataset_file(data, ds, "train"), dev],
                                                        retriever="bm25", cache=False)
                        setup = setups[ds]
                        runner = IRRRRunner(model, setup.retriever,
                                            IRRRConfig(k=k, first_k=fk, max_path=max_path, query_threshold=qt,
                                                       answer_threshold=float("inf")))
                        for q, g in zip(setup.questions, setup.gold):
                            if q.id not in log:
                                log.append({"qid": q.id, "answers": q.answers, "gold": g,
                                            "steps": runner.run([q.question])[0]["steps"]})
                    runs[qt, fk][ds] = [log.get(q.id) for q in questions]
                print(f"query_threshold={qt} first_k={fk} {ds}: {len(questions)} questions run to the cap",
                      file=sys.stderr)
    return runs


def score_grid(runs: dict[tuple, dict[str, list[dict]]], answer_thresholds: Sequence[float],
               fill_orders: Sequence[str], return_k: int | None) -> list[dict[str, Any]]:
    """Every (query threshold, first-step depth, answerability threshold, fill order), replayed: per dataset F1,
    recall, steps, paragraphs read and returned, and their means over the datasets."""
    from effrag.evaluation.metrics import f1, recall

    grid = []
    for (qt, fk), by_ds in runs.items():
        for at, fo in [(at, fo) for at in answer_thresholds for fo in fill_orders]:
            entry: dict[str, Any] = {"query_threshold": qt, "first_k": fk, "answer_threshold": at, "fill_order": fo}
            for ds, rows in by_ds.items():
                res = [replay(r["steps"], at, return_k, fo) for r in rows]
                n = max(1, len(rows))
                entry[ds] = {"f1": sum(f1(a, r["answers"]) for (a, *_), r in zip(res, rows)) / n,
                             "recall": sum(recall(ids, r["gold"]) for (_, ids, *_), r in zip(res, rows)) / n,
                             "steps": sum(x[2] for x in res) / n, "read": sum(x[3] for x in res) / n,
                             "returned": sum(len(x[1]) for x in res) / n}
            for key in ("f1", "recall", "read"):
                entry[key] = sum(entry[ds][key] for ds in by_ds) / len(by_ds)
            grid.append(entry)
    return grid


def tune_irrr(model, data: str | Path, output: str | Path, *, datasets: Sequence[str], limit: int | None = 40,
              query_thresholds: Sequence[float] = (0.2, 0.35, 0.5),
              answer_thresholds: Sequence[float] = (-4, -2, -1, 0, 1, 2, 3, 4, 6), max_path: int = 4, k: int = 5,
              first_ks: Sequence[int | None] = (None,), return_k: int | None = None,
              fill_orders: Sequence[str] = ("rerank",), objective: str = "f1",
              settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run and replay the grid; write ``output/grid.json`` (with ``settings``, the command's), ``best.json`` (the
    chosen IRRR options) and ``table.md`` (best first). Returns ``{"grid", "ranked", "best", "config"}``."""
    from effrag.evaluation.report import md_table

    if objective not in ("f1", "recall"):
        raise ValueError(f"objective must be f1 or recall, got {objective!r}")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    runs = runs_to_cap(model, data, datasets, output, limit=limit, query_thresholds=query_thresholds,
                       first_ks=first_ks, k=k, max_path=max_path)
    grid = score_grid(runs, answer_thresholds, fill_orders, return_k)
    best = max(grid, key=lambda e: (round(e[objective], 6), -e["read"]))
    write_text_atomic((output / "grid.json"), json.dumps({"config": settings or {}, "grid": grid}, indent=2))
    cfg = {"query_threshold": best["query_threshold"], "answer_threshold": best["answer_threshold"],
           "max_path": max_path, "k": k}
    cfg.update({key: value for key, value in (("first_k", best["first_k"]), ("return_k", return_k)) if value})
    if return_k and best["fill_order"] != "rerank":
        cfg["fill_order"] = best["fill_order"]
    write_text_atomic((output / "best.json"), json.dumps(cfg, indent=2) + "\n")
    head = ["query_threshold", "first_k", "answer_threshold", "fill_order", f"mean {objective}", "mean read"]
    head += [f"{ds} {m}" for ds in datasets for m in ("recall", "f1", "returned", "read")]
    ranked = sorted(grid, key=lambda e: (-round(e[objective], 6), e["read"]))
    table = [[e["query_threshold"], e["first_k"] or k, e["answer_threshold"], e["fill_order"], f"{e[objective]:.4f}",
              f"{e['read']:.1f}"] + [f"{e[ds][m]:.4f}" if m in ("recall", "f1") else f"{e[ds][m]:.1f}"
                                     for ds in datasets for m in ("recall", "f1", "returned", "read")]
             for e in ranked]
    write_text_atomic((output / "table.md"),
        f"IRRR tuning on the first {limit} dev questions per dataset, objective mean {objective}; "
        f"k={k}, max_path={max_path}, return_k={return_k}. Best first.\n\n"
        + md_table(head, [[str(c) for c in row] for row in table]))
    return {"grid": grid, "ranked": ranked, "best": best, "config": cfg}


def crossfit_rows(runs: dict[tuple, dict[str, list[dict]]], answer_thresholds: Sequence[float],
                  fill_orders: Sequence[str], return_k: int, *, k: int, max_path: int) -> dict[str, list[dict]]:
    """The grid replayed as cross-fitting rows (:class:`effrag.tuning.crossfit.Candidates`), per dataset: each
    config (the IRRR options a model folder's ``irrr.json`` holds) with every question's ``[qid, gold count, [1-based
    positions of the gold in the returned paragraphs], paragraphs returned, [paragraphs read, 0, 0]]``, so the
    returned list cut at any budget scores on any fold, as EfficientRAG's pool is. The rows' ``max_candidates`` is
    ``return_k``: a budget above it scores the same paragraphs."""
    from .efficientrag import question_entry

    out: dict[str, list[dict]] = {}
    for (qt, fk), by_ds in runs.items():
        for at in answer_thresholds:
            for fo in fill_orders:
                config = {"k": k, "first_k": fk, "max_path": max_path, "query_threshold": qt, "answer_threshold": at,
                          "return_k": return_k, "fill_order": fo, "max_candidates": return_k}
                for ds, rows in by_ds.items():
                    per_q = []
                    for r in rows:
                        _, ids, _, read = replay(r["steps"], at, return_k, fo)
                        per_q.append(question_entry(r["qid"], ids, r["gold"], [read, 0, 0]))
                    out.setdefault(ds, []).append({"config": config, "per_question": per_q})
    return out
