#!/usr/bin/env python
"""Grid search of EfficientRAG's loop options on a dev file: recall vs. chunks retrieved.

Thresholds change which chunks continue, never what the models say about a
given input, so retrieval results (per query and k), Labeler outputs (per query
and chunk) and Filter outputs (per input) are cached across the whole grid: a
configuration only pays model time for inputs no earlier one produced.

Each finished configuration is appended to ``results.jsonl`` (a rerun skips
them); ``table.md`` ranks all of them, marks the recall/chunks Pareto front, shows each
configuration's "seen recall" (gold passages among every chunk labeled in any hop: the ceiling no
pool order or cap can exceed), and
``best.json`` (``{"config": ..., "metrics": ...}``) is the highest-recall
configuration within ``--chunk-budget`` average chunks, ready for
``effrag eval --method efficientrag --er-config best.json``.

    python scripts/tune_efficientrag.py --labeler L --filter F --questions dev.jsonl --retriever dense \\
        --grid tag_threshold=0.3,0.5,0.7 token_threshold=0.3,0.5 query_mode=merged,per_chunk hop_k=5,10 \\
        --chunk-budget 10 --output runs/tune-hotpotqa
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import time
from pathlib import Path

_BENCH = Path(__file__).resolve().parent / "bench_efficientrag.py"
_spec = importlib.util.spec_from_file_location("bench_efficientrag", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

GRID_TYPES = {"hop_k": int, "max_hops": int, "max_branches": int, "max_candidates": int, "min_candidates": int,
              "pool_order": str, "retrieval_weight": float,
              "tag_threshold": float, "token_threshold": float, "filter_threshold": float,
              "query_mode": str, "dedup": str}


class CachedRetriever:
    def __init__(self, retriever):
        self.retriever, self.cache = retriever, {}

    def search(self, queries, k):
        todo = [q for q in dict.fromkeys(queries) if (q, k) not in self.cache]
        if todo:
            for q, hits in zip(todo, self.retriever.search(todo, k)):
                self.cache[(q, k)] = hits
        return [self.cache[(q, k)] for q in queries]


class CachedModel:
    """Memoises ``predict`` per input (the options of one tuning run are fixed)."""

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


def parse_grid(items: list[str]) -> list[dict]:
    axes = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or name not in GRID_TYPES:
            raise SystemExit(f"bad --grid item {item!r}: expected NAME=V1,V2 with NAME in {sorted(GRID_TYPES)}")
        try:
            axes[name] = [GRID_TYPES[name](v) for v in values.split(",") if v]
        except ValueError as e:
            raise SystemExit(f"bad value in --grid {item!r}: {e}") from None
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def pareto(rows: list[dict]) -> set[int]:
    """Indices of rows no other row beats on both recall (higher) and chunks (fewer)."""
    front = set()
    for i, r in enumerate(rows):
        if not any(o["recall"] >= r["recall"] and o["avg_chunks"] <= r["avg_chunks"]
                   and (o["recall"] > r["recall"] or o["avg_chunks"] < r["avg_chunks"]) for o in rows):
            front.add(i)
    return front


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_setup_args(p)
    p.add_argument("--grid", nargs="+", default=["tag_threshold=0.3,0.5,0.7", "token_threshold=0.3,0.5",
                                                  "query_mode=merged,per_chunk"], metavar="NAME=V1,V2")
    p.add_argument("--chunk-budget", type=float, default=None, help="best = highest recall with at most this many "
                   "average chunks (default: highest recall, fewer chunks on ties)")
    p.add_argument("--batch-size", type=int, default=64, help="questions per loop call")
    p.add_argument("--output", required=True, type=Path)
    args = p.parse_args(argv)
    from tqdm.auto import tqdm

    from effrag.evaluation.metrics import recall

    grid = parse_grid(args.grid)
    questions, gold, corpus, retriever, pipe = bench.setup(args)
    loop = pipe.loop
    base = loop.config
    loop.retriever = CachedRetriever(loop.retriever)
    loop.labeler, loop.filter = CachedModel(loop.labeler, pairs=True), CachedModel(loop.filter, pairs=False)
    args.output.mkdir(parents=True, exist_ok=True)
    meta = {"questions": str(Path(args.questions).resolve()), "n": len(questions), "seed": args.seed,
            "retriever": getattr(retriever, "kind", None), "corpus_fingerprint": corpus.fingerprint(),
            "labeler": str(args.labeler), "filter": str(args.filter), "base_config": base.to_json()}
    (args.output / "tune_config.json").write_text(json.dumps({**meta, "grid": args.grid}, indent=2))
    res_path = args.output / "results.jsonl"
    done = {}
    if res_path.is_file():
        for line in res_path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row["setup"] == meta:
                    done[json.dumps(row["config"], sort_keys=True)] = row
    texts = [q.question for q in questions]
    with res_path.open("a") as f:
        for changes in tqdm(grid, desc="grid", unit="config"):
            cfg = base.replace(**changes)
            key = json.dumps(cfg.to_json(), sort_keys=True)
            if key in done:
                continue
            loop.config = cfg
            t0 = time.perf_counter()
            results = [r for i in range(0, len(texts), args.batch_size) for r in loop.run(texts[i: i + args.batch_size])]
            n = len(results)
            row = {"config": cfg.to_json(), "changes": changes, "setup": meta,
                   "recall": sum(recall([c.id for c in r.chunks], g) for r, g in zip(results, gold)) / n,
                   "avg_chunks": sum(len(r.chunks) for r in results) / n,
                   # the ceiling of any pool order or cap: gold passages among every chunk the loop labeled
                   "seen_recall": sum(recall([c["id"] for e in r.trace for c in e["chunks"]], g)
                                      for r, g in zip(results, gold)) / n,
                   "avg_seen": sum(sum(len(e["chunks"]) for e in r.trace) for r in results) / n,
                   "iterations": sum(r.iterations for r in results) / n,
                   "empty_pool": sum(not r.chunks for r in results) / n, "seconds": time.perf_counter() - t0}
            f.write(json.dumps(row) + "\n")
            f.flush()
            done[key] = row
    rows = sorted(done.values(), key=lambda r: (-r["recall"], r["avg_chunks"]))
    front = pareto(rows)
    ok = [r for r in rows if args.chunk_budget is None or r["avg_chunks"] <= args.chunk_budget]
    if ok:
        (args.output / "best.json").write_text(json.dumps({"config": ok[0]["config"], "metrics": {
            k: ok[0][k] for k in ("recall", "avg_chunks", "iterations", "empty_pool")}, "setup": meta}, indent=2))
    names = sorted({k for r in rows for k in r["changes"]})
    lines = [f"# EfficientRAG tuning: {len(questions)} questions of {meta['questions']}", "",
             "| " + " | ".join(names) + " | recall | avg chunks | iterations | empty pool | seen recall | seen chunks "
             "| Pareto |",
             "|" + "---|" * len(names) + "---:|---:|---:|---:|---:|---:|:---:|"]
    for i, r in enumerate(rows):
        cells = [str(r["changes"].get(n, r["config"].get(n))) for n in names]
        lines.append("| " + " | ".join(cells) + f" | {100 * r['recall']:.2f} | {r['avg_chunks']:.2f} | "
                     f"{r['iterations']:.2f} | {100 * r['empty_pool']:.1f}% | "
                     + (f"{100 * r['seen_recall']:.2f} | {r['avg_seen']:.1f} | " if "seen_recall" in r else "- | - | ")
                     + f"{'*' if i in front else ''} |")
    lines += ["", f"best (chunk budget {args.chunk_budget}): " + (json.dumps(ok[0]["changes"]) if ok else "none"), ""]
    (args.output / "table.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
