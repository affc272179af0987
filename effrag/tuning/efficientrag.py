"""Tuning EfficientRAG's loop on a dev file: a grid over :class:`EfficientRAGConfig`, cached model calls,
recall against chunks, and the choice of the best config within a chunk budget.

Thresholds and pool options change which chunks continue, never what a model says about a given
input, so :class:`CachedRetriever` and :class:`CachedModel` memoise retrieval (per query and k) and
Labeler / Filter outputs (per input) across the whole grid: a configuration only pays model time for
inputs no earlier one produced. Options that act after the loop (``pool_order``, ``pool_source``,
``retrieval_weight``, ``max_candidates``) cost no model call at all.

Every run config also yields its *curve*: the recall of its ranked pool cut at 1..N chunks, which is
exactly that config with ``max_candidates=c``; :func:`candidates` lets those caps compete for the best
config within a budget. :func:`run_grid` runs a grid into a resumable tuning folder;
``scripts/tune_efficientrag.py`` and the recipe are its command-line front ends.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..evaluation.metrics import recall
from ..pipelines.efficientrag import EfficientRAGConfig
from ..pipelines.result import Result
from ..state_files import write_text_atomic


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise ValueError(f"expected true or false, got {v!r}")
    return v.lower() == "true"


def _or_none(typ: type):
    return lambda v: None if v.lower() == "none" else typ(v)


_TYPES = {"int": int, "float": float, "str": str, "int | None": _or_none(int), "float | None": _or_none(float),
          "bool": _bool}
GRID_TYPES: dict[str, Any] = {f.name: _TYPES[str(f.type)] for f in fields(EfficientRAGConfig)
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
    """A Labeler's or ranker's (``pairs=True``) or Filter's ``predict`` memoised per input and per the options that
    change an output (``max_length``, ``bf16``), so grid configs that cut inputs differently never share one."""

    def __init__(self, model, pairs: bool):
        self.model, self.pairs, self.cache = model, pairs, {}

    def predict(self, *args, **kw):
        how = tuple(sorted((k, v) for k, v in kw.items() if k != "batch_size"))  # max_length, bf16 change outputs
        keys = [(how, *k) for k in zip(args[0], map(tuple, args[1]))] if self.pairs else \
            [(how, tuple(w)) for w in args[0]]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if todo:
            inputs = ([k[1] for k in todo], [list(k[2]) for k in todo]) if self.pairs else ([list(k[1]) for k in todo],)
            for key, out in zip(todo, self.model.predict(*inputs, **kw)):
                self.cache[key] = out
        return [self.cache[k] for k in keys]


def model_fingerprint(path: str | Path, with_options: bool = False) -> str | None:
    """A checkpoint's :func:`effrag.models.fingerprint` (its recorded weight hashes), as tuning setups and run
    configs record it; imported on use, so that reading tuning folders needs no torch."""
    from ..models.model_files import fingerprint

    return fingerprint(path, with_options)


def parse_grid(items: Sequence[str]) -> list[dict[str, Any]]:
    """``["hop_k=5,10", "pool_source=seen"]`` -> every combination as a dict of config changes. An optional
    option takes ``none`` (``query_chunks=1,none``); a flag takes ``true``/``false``. A *tied* item moves several
    options together, names and each value's parts joined by ``+``: ``first_hop_k+hop_k=30+10,10+5`` gives two
    settings (30, 10) and (10, 5), not four: the points of a cost curve, or the structures of several configs."""
    axes: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        names = name.split("+")
        if not sep or not all(n in GRID_TYPES for n in names) or len(set(names)) != len(names):
            raise ValueError(f"bad grid item {item!r}: expected NAME=V1,V2 (or NAME+NAME=V+V,V+V) with NAME in "
                             f"{sorted(GRID_TYPES)}")
        try:
            axes[name] = []
            for v in (v for v in values.split(",") if v):
                parts = v.split("+")
                if len(parts) != len(names):
                    raise ValueError(f"{v!r} has {len(parts)} parts for {len(names)} names")
                axes[name].append(tuple(GRID_TYPES[n](x) for n, x in zip(names, parts)))
        except ValueError as e:
            raise ValueError(f"bad value in grid item {item!r}: {e}") from None
        if not axes[name]:
            raise ValueError(f"grid item {item!r} has no values")
    out = []
    for combo in itertools.product(*axes.values()):
        changes: dict[str, Any] = {}
        for name, values in zip(axes, combo):
            changes.update(zip(name.split("+"), values))
        out.append(changes)
    return out


def read_grid_file(path: str | Path) -> list[str]:
    """The ``grid:`` list of ``NAME=V1,V2`` items of a YAML file (``effrag/configs/efficientrag_recipe.yaml``), each
    checked by :func:`parse_grid`; a bad file is one error naming it and the item."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read a grid file ({' '.join(str(e).split())})") from None
    items = data.get("grid") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{path}: expected `grid:` as a list of NAME=V1,V2 strings")
    for n, item in enumerate(items):
        try:
            parse_grid([item])
        except ValueError as e:
            raise ValueError(f"{path}: grid[{n}]: {e}") from None
    return items


def forwards(hops: Sequence[dict]) -> list[int]:
    """``[Labeler pairs, ranker pairs, Filter inputs]`` an EfficientRAG loop read for one question (its hops: a
    result's ``hops``, also of a predictions row read back, :meth:`effrag.pipelines.Result.from_row`): its reading
    cost."""
    chunks = [c for e in hops for c in e["chunks"]]
    return [sum(c.get("p_continue") is not None for c in chunks),
            sum("rank_score" in c for c in chunks) + sum(len(e.get("rescored", [])) for e in hops),
            sum(len(e.get("filter_inputs", [])) for e in hops)]


def question_entry(qid: str, ranked_ids, gold, forwards) -> list:
    """One question's ``per_question`` entry: ``[qid, gold count, [1-based positions of the gold found in
    ranked_ids], len(ranked_ids), forwards]`` (what the loop read for it)."""
    want = set(gold)
    ranked = list(ranked_ids)
    return [qid, len(want), [i for i, c in enumerate(ranked, start=1) if c in want], len(ranked), forwards]


def per_question(results: Sequence[Result], gold: Sequence[Sequence[str]], ids: Sequence[str]) -> list[list]:
    """``[qid, gold count, [1-based pool positions of the gold found], pool size, forwards]`` per question:
    enough to score any cap of the pool on any subset of the questions (:mod:`.crossfit`), with what the
    loop read for it (:func:`forwards`)."""
    return [question_entry(qid, (c.id for c in r.chunks), g, forwards(r.hops)) for qid, r, g in zip(ids, results, gold)]


def score_results(results: Sequence[Result], gold: Sequence[Sequence[str]], curve_max: int = 10,
                  ids: Sequence[str] | None = None) -> dict[str, Any]:
    """Recall, chunks, seen recall (gold among every chunk labeled in any hop: the ceiling of any pool
    order or cap) and the curve ``[[c, recall, avg_chunks], ...]`` of the pool cut at c = 1..curve_max;
    with ``ids`` (the questions' ids), each question's gold positions too (``per_question``)."""
    n = len(results)
    if n == 0 or n != len(gold):
        raise ValueError(f"{n} results for {len(gold)} gold lists")
    extra = {"per_question": per_question(results, gold, ids)} if ids is not None else {}
    return {**extra,
        "recall": sum(recall([c.id for c in r.chunks], g) for r, g in zip(results, gold)) / n,
        "avg_chunks": sum(len(r.chunks) for r in results) / n,
        "seen_recall": sum(recall([i for e in r.hops for i in e.read], g) for r, g in zip(results, gold)) / n,
        "avg_seen": sum(sum(len(e.read) for e in r.hops) for r in results) / n,
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


def loop_key(config: EfficientRAGConfig) -> str:
    """What decides a loop run: every option but those acting on the finished pools (the ``pool`` group of
    :data:`~effrag.pipelines.efficientrag.config.OPTION_GROUPS`). Configs with one key share a run
    (:func:`run_grid` orders the grid so that they come together)."""
    import json

    from ..pipelines.efficientrag.config import POOL_OPTIONS

    return json.dumps({k: v for k, v in config.to_json().items() if k not in POOL_OPTIONS}, sort_keys=True)


def direct_r_curve(retriever, questions: Sequence[str], gold: Sequence[Sequence[str]], k_max: int) -> list[dict]:
    """Direct-R's recall at k = 1..k_max (each question's top k) on the same questions and retriever."""
    hits = retriever.search(list(questions), k_max)
    n = len(questions)
    return [{"k": k, "recall": sum(recall([h.id for h in hs[:k]], g) for hs, g in zip(hits, gold)) / n,
             "avg_chunks": sum(min(k, len(hs)) for hs in hits) / n} for k in range(1, k_max + 1)]


# ---------------------------------------------------------------------------- the grid run
def tuning_setup(run, labeler: str | Path, filter: str | Path, ranker: str | Path | None,  # noqa: A002
                 base_config: Any, seed: int = 0) -> dict[str, Any]:
    """A tuning folder's ``setup``: the run identity (:meth:`effrag.setup.RunSetup.identity`) and what the grid
    runs with (models and their weights' fingerprints, the base config). Rows resume under the same setup only
    (the identity's ``schema`` included)."""
    setup = {"questions": run.sources["questions"], "n": len(run.questions), "seed": seed,
             "retriever": getattr(run.retriever, "kind", None), "corpus_fingerprint": run.corpus.fingerprint(),
             "labeler": str(labeler), "filter": str(filter), "base_config": base_config.to_json(),
             "model_files": {"labeler": model_fingerprint(labeler), "filter": model_fingerprint(filter)}}
    if ranker:
        setup["ranker"], setup["model_files"]["ranker"] = str(ranker), model_fingerprint(ranker)
    return {**run.identity(), **setup}


def run_grid(loop, texts: Sequence[str], gold: Sequence[Sequence[str]], grid: Sequence[dict[str, Any]],
             output: str | Path, setup: dict[str, Any], *, grid_spec: Sequence[str] = (), chunk_budget: float | None = None,
             batch_size: int = 64, curve_max: int = 10, direct_k_max: int = 30,
             show_progress: bool = True, ids: Sequence[str] | None = None,
             commit: str | None = None) -> dict[str, Any]:
    """Run every config of ``grid`` (changes to ``loop.config``) on ``texts`` and write the tuning folder.

    ``output`` gets ``results.jsonl`` (one row per finished config, resumed on a rerun when its
    ``setup`` matches), ``tune_config.json`` (the setup and every grid run into the folder),
    ``best.json`` (highest recall within ``chunk_budget`` average chunks: an ``--er-config``),
    ``curve.json`` (best config per budget 1..``curve_max`` next to Direct-R at k = 1..``direct_k_max``)
    and ``table.md``. The loop's retriever and models are wrapped in caches for the whole grid. With ``ids``
    (the questions' ids) each row also keeps every question's gold positions (``per_question``), which
    :mod:`.crossfit` needs. With ``commit`` (:func:`effrag.provenance.report_source`), each new row records it and
    ``tune_config.json`` lists every commit that ran into the folder (``commits``); neither decides a resume.
    Returns ``{"rows", "best", "direct", "table"}``.
    """
    import json
    import time

    from tqdm.auto import tqdm

    from ..jsonl import ResultLog
    from ..setup import same_run

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    base = loop.config
    if not isinstance(loop.retriever, CachedRetriever):
        loop.retriever = CachedRetriever(loop.retriever)
    if not isinstance(loop.labeler, CachedModel):
        loop.labeler, loop.filter = CachedModel(loop.labeler, pairs=True), CachedModel(loop.filter, pairs=False)
    if loop.ranker is not None and not isinstance(loop.ranker, CachedModel):
        loop.ranker = CachedModel(loop.ranker, pairs=True)
    cfg_path = out / "tune_config.json"  # every grid run into this folder (results.jsonl holds them all)
    grids = json.loads(cfg_path.read_text()).get("grids", []) if cfg_path.is_file() else []
    grids += [list(grid_spec)] if grid_spec and list(grid_spec) not in grids else []
    commits = json.loads(cfg_path.read_text()).get("commits", []) if cfg_path.is_file() else []
    commits += [commit] if commit and commit not in commits else []
    write_text_atomic(cfg_path, json.dumps({**setup, "grids": grids, **({"commits": commits} if commits else {})},
                                           indent=2))
    config_key = lambda row: json.dumps(row["config"], sort_keys=True)  # noqa: E731
    try:
        with ResultLog(out / "results.jsonl", config_key, where=lambda row: same_run(row["setup"], setup)) as log:
            shared: tuple[str | None, list] = (None, [])  # (loop key, states): the last loop run, re-ranked
            grid = sorted(grid, key=lambda ch: loop_key(base.replace(**ch)))  # one loop run per key
            for changes in tqdm(grid, desc="grid", unit="config", disable=not show_progress):
                cfg = base.replace(**changes)
                if json.dumps(cfg.to_json(), sort_keys=True) in log:
                    continue
                loop.config = cfg
                t0 = time.perf_counter()
                key = loop_key(cfg)
                if key != shared[0]:
                    states = [s for i in range(0, len(texts), batch_size)
                              for s in loop.run_states(list(texts[i: i + batch_size]))]
                    shared = (key, states)
                results = loop.rank_pools(shared[1], cfg)
                log.append({"config": cfg.to_json(), "changes": changes, "setup": setup,
                            **score_results(results, gold, curve_max, ids=ids), "seconds": time.perf_counter() - t0,
                            **({"commit": commit} if commit else {})})
            rows = sorted(log.rows.values(), key=lambda r: (-r["recall"], r["avg_chunks"]))
    finally:
        loop.config = base
    best = best_within(rows, chunk_budget)
    if best:
        write_text_atomic((out / "best.json"), json.dumps({"config": best["config"], "metrics": {
            k: best[k] for k in ("recall", "avg_chunks", "iterations", "empty_pool", "seen_recall", "avg_seen")
            if k in best}, "curve": best.get("curve"), "setup": setup}, indent=2))
    direct = direct_r_curve(loop.retriever, texts, gold, max(curve_max, direct_k_max))  # @20/@30: Table-2 shape
    per_budget = best_per_budget(rows, range(1, curve_max + 1))
    write_text_atomic((out / "curve.json"), json.dumps({"setup": setup, "direct_r": direct, "efficientrag": per_budget},
                                               indent=2))
    table = tuning_report(rows, best, direct, per_budget, chunk_budget, setup)
    write_text_atomic((out / "table.md"), table)
    return {"rows": rows, "best": best, "direct": direct, "table": table}


def tuning_report(rows: Sequence[dict], best: dict | None, direct: Sequence[dict], per_budget: Sequence[dict],
                  chunk_budget: float | None, setup: dict[str, Any]) -> str:
    """``table.md``: every config ranked (Pareto front marked), the best within the budget, the recall curve."""
    import json
    from dataclasses import asdict

    from ..evaluation.report import md_table

    names = sorted({k for r in rows for k in r["changes"]})
    defaults = asdict(EfficientRAGConfig())  # a row written before an option existed leaves it out: its default
    front = pareto(rows)
    body = [[*(str(r["changes"].get(n, r["config"].get(n, defaults.get(n)))) for n in names), f"{100 * r['recall']:.2f}",
             f"{r['avg_chunks']:.2f}", f"{r['iterations']:.2f}", f"{100 * r['empty_pool']:.1f}%",
             f"{100 * r['seen_recall']:.2f}" if "seen_recall" in r else "-",
             f"{r['avg_seen']:.1f}" if "avg_seen" in r else "-", "*" if i in front else ""]
            for i, r in enumerate(rows)]
    header = [*names, "recall", "avg chunks", "iterations", "empty pool", "seen recall", "seen chunks", "Pareto"]
    by_k = {d["k"]: d for d in direct}
    curve = [[e["budget"], f"{100 * by_k[e['budget']]['recall']:.2f}", f"{100 * e['recall']:.2f}",
              f"{e['avg_chunks']:.2f}", "yes" if e["recall"] > by_k[e["budget"]]["recall"] else "no"]
             for e in per_budget if e["budget"] in by_k]
    best_line = ("none" if not best else json.dumps(best["changes"]) + f" max_candidates={best['config']['max_candidates']}: "
                 f"recall {100 * best['recall']:.2f} with {best['avg_chunks']:.2f} chunks")
    return "\n".join([
        f"# EfficientRAG tuning: {setup.get('n')} questions of {setup.get('questions')}", "",
        md_table(header, body, "l" * len(names) + "rrrrrrc"),
        f"best (chunk budget {chunk_budget}): {best_line}", "",
        "## Recall vs chunks (best config within each budget, vs Direct-R@k)", "",
        md_table(["chunks", "Direct-R recall", "EfficientRAG recall", "EfficientRAG avg chunks", "ahead"], curve, "rrrrc"),
    ])
