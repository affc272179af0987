"""Tuning EfficientRAG's loop on a dev file: a grid over :class:`EfficientRAGConfig`, cached model calls,
recall against chunks, and the choice of the best config within a chunk budget.

Thresholds and pool options change which chunks continue, never what a model says about a given
input, so :class:`CachedRetriever` and :class:`CachedModel` memoise retrieval (per query and k) and
Labeler / Filter outputs (per input) across the whole grid: a configuration only pays model time for
inputs no earlier one produced. Options that act after the loop (``pool_order``, ``pool_source``,
``retrieval_weight``, ``max_candidates``) cost no model call at all.

Every run config also yields its *curve*: the recall of its ranked pool cut at 1..N chunks, which is
exactly that config with ``max_candidates=c``; :func:`candidates` lets those caps compete for the best
config within a budget. ``scripts/tune_efficientrag.py`` is the command-line front end.
"""
from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any, Iterable, Sequence

from .evaluation.metrics import recall
from .pipelines.efficientrag import EfficientRAGConfig, LoopResult

_TYPES = {"int": int, "float": float, "str": str, "int | None": int, "float | None": float}
GRID_TYPES: dict[str, type] = {f.name: _TYPES[str(f.type)] for f in fields(EfficientRAGConfig)
                               if str(f.type) in _TYPES and f.name not in ("batch_size",)}


class CachedRetriever:
    """``search`` memoised per (query, k)."""

    def __init__(self, retriever):
        self.retriever, self.cache = retriever, {}

    def search(self, queries, k):
        todo = [q for q in dict.fromkeys(queries) if (q, k) not in self.cache]
        if todo:
            for q, hits in zip(todo, self.retriever.search(todo, k)):
                self.cache[(q, k)] = hits
        return [self.cache[(q, k)] for q in queries]


class CachedModel:
    """A Labeler's (``pairs=True``) or Filter's ``predict`` memoised per input (one run's options are fixed)."""

    def __init__(self, model, pairs: bool):
        self.model, self.pairs, self.cache = model, pairs, {}

    def predict(self, *args, **kw):
        keys = list(zip(args[0], map(tuple, args[1]))) if self.pairs else [tuple(w) for w in args[0]]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if todo:
            inputs = ([k[0] for k in todo], [list(k[1]) for k in todo]) if self.pairs else ([list(k) for k in todo],)
            for key, out in zip(todo, self.model.predict(*inputs, **kw)):
                self.cache[key] = out
        return [self.cache[k] for k in keys]


def parse_grid(items: Sequence[str]) -> list[dict[str, Any]]:
    """``["hop_k=5,10", "pool_source=seen"]`` -> every combination as a dict of config changes."""
    axes: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or name not in GRID_TYPES:
            raise ValueError(f"bad grid item {item!r}: expected NAME=V1,V2 with NAME in {sorted(GRID_TYPES)}")
        try:
            axes[name] = [GRID_TYPES[name](v) for v in values.split(",") if v]
        except ValueError as e:
            raise ValueError(f"bad value in grid item {item!r}: {e}") from None
        if not axes[name]:
            raise ValueError(f"grid item {item!r} has no values")
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def score_results(results: Sequence[LoopResult], gold: Sequence[Sequence[str]], curve_max: int = 10) -> dict[str, Any]:
    """Recall, chunks, seen recall (gold among every chunk labeled in any hop: the ceiling of any pool
    order or cap) and the curve ``[[c, recall, avg_chunks], ...]`` of the pool cut at c = 1..curve_max."""
    n = len(results)
    if n == 0 or n != len(gold):
        raise ValueError(f"{n} results for {len(gold)} gold lists")
    return {
        "recall": sum(recall([c.id for c in r.chunks], g) for r, g in zip(results, gold)) / n,
        "avg_chunks": sum(len(r.chunks) for r in results) / n,
        "seen_recall": sum(recall([c["id"] for e in r.trace for c in e["chunks"]], g) for r, g in zip(results, gold)) / n,
        "avg_seen": sum(sum(len(e["chunks"]) for e in r.trace) for r in results) / n,
        "curve": [[c, sum(recall([x.id for x in r.chunks[:c]], g) for r, g in zip(results, gold)) / n,
                   sum(min(c, len(r.chunks)) for r in results) / n] for c in range(1, curve_max + 1)],
        "iterations": sum(r.iterations for r in results) / n,
        "empty_pool": sum(not r.chunks for r in results) / n,
    }


def pareto(rows: Sequence[dict]) -> set[int]:
    """Indices of rows no other row beats on both recall (higher) and chunks (fewer)."""
    front = set()
    for i, r in enumerate(rows):
        if not any(o["recall"] >= r["recall"] and o["avg_chunks"] <= r["avg_chunks"]
                   and (o["recall"] > r["recall"] or o["avg_chunks"] < r["avg_chunks"]) for o in rows):
            front.add(i)
    return front


def candidates(rows: Iterable[dict], budget: float | None) -> list[dict]:
    """Every run config, and each one capped at c chunks (from its curve), within ``budget`` average chunks."""
    out = []
    for r in rows:
        if budget is None or r["avg_chunks"] <= budget:
            out.append(r)
        cap = r["config"].get("max_candidates")
        for c, rec, chunks in r.get("curve", []):
            if (budget is None or chunks <= budget) and (cap is None or c < cap):
                out.append({**r, "config": {**r["config"], "max_candidates": c}, "recall": rec, "avg_chunks": chunks})
    return out


def best_within(rows: Iterable[dict], budget: float | None) -> dict | None:
    """The highest-recall candidate within ``budget`` chunks (fewer chunks on ties), or None."""
    ok = sorted(candidates(rows, budget), key=lambda r: (-r["recall"], r["avg_chunks"]))
    return ok[0] if ok else None


def best_per_budget(rows: Sequence[dict], budgets: Iterable[int]) -> list[dict]:
    """For each chunk budget: ``{budget, recall, avg_chunks, config}`` of the best candidate within it."""
    out = []
    for b in budgets:
        best = best_within(rows, b)
        if best:
            out.append({"budget": b, "recall": best["recall"], "avg_chunks": best["avg_chunks"], "config": best["config"]})
    return out


def direct_r_curve(retriever, questions: Sequence[str], gold: Sequence[Sequence[str]], k_max: int) -> list[dict]:
    """Direct-R's recall at k = 1..k_max (each question's top k) on the same questions and retriever."""
    hits = retriever.search(list(questions), k_max)
    n = len(questions)
    return [{"k": k, "recall": sum(recall([h.id for h in hs[:k]], g) for hs, g in zip(hits, gold)) / n,
             "avg_chunks": sum(min(k, len(hs)) for hs in hits) / n} for k in range(1, k_max + 1)]
