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
import json
import sys
import time
from pathlib import Path

_BENCH = Path(__file__).resolve().parent / "bench_efficientrag.py"
_spec = importlib.util.spec_from_file_location("bench_efficientrag", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

def curve_table(direct: list[dict], er: list[dict]) -> list[str]:
    by_k = {d["k"]: d for d in direct}
    lines = ["## Recall vs chunks (best config within each budget, vs Direct-R@k)", "",
             "| chunks | Direct-R recall | EfficientRAG recall | EfficientRAG avg chunks | ahead |",
             "|---:|---:|---:|---:|:---:|"]
    for e in er:
        d = by_k.get(e["budget"])
        if d:
            lines.append(f"| {e['budget']} | {100 * d['recall']:.2f} | {100 * e['recall']:.2f} | "
                         f"{e['avg_chunks']:.2f} | {'yes' if e['recall'] > d['recall'] else 'no'} |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_setup_args(p)
    p.add_argument("--grid", nargs="+", default=["tag_threshold=0.3,0.5,0.7", "token_threshold=0.3,0.5",
                                                  "query_mode=merged,per_chunk"], metavar="NAME=V1,V2")
    p.add_argument("--chunk-budget", type=float, default=None, help="best = highest recall with at most this many "
                   "average chunks (default: highest recall, fewer chunks on ties)")
    p.add_argument("--batch-size", type=int, default=64, help="questions per loop call")
    p.add_argument("--curve-max", type=int, default=10, help="recall of each pool truncated at 1..N chunks "
                   "(= max_candidates N); with --chunk-budget, truncations compete for best too")
    p.add_argument("--output", required=True, type=Path)
    args = p.parse_args(argv)
    from tqdm.auto import tqdm

    from effrag.tuning import (CachedModel, CachedRetriever, best_per_budget, best_within, direct_r_curve,
                               parse_grid, pareto, score_results)

    try:
        grid = parse_grid(args.grid)
    except ValueError as e:
        p.error(str(e))
    questions, gold, corpus, retriever, pipe = bench.setup(args)
    loop = pipe.loop
    base = loop.config
    loop.retriever = CachedRetriever(loop.retriever)
    loop.labeler, loop.filter = CachedModel(loop.labeler, pairs=True), CachedModel(loop.filter, pairs=False)
    args.output.mkdir(parents=True, exist_ok=True)
    meta = {"questions": str(Path(args.questions).resolve()), "n": len(questions), "seed": args.seed,
            "retriever": getattr(retriever, "kind", None), "corpus_fingerprint": corpus.fingerprint(),
            "labeler": str(args.labeler), "filter": str(args.filter), "base_config": base.to_json()}
    cfg_path = args.output / "tune_config.json"  # every grid run into this folder (results.jsonl holds them all)
    grids = json.loads(cfg_path.read_text()).get("grids", []) if cfg_path.is_file() else []
    grids += [args.grid] if args.grid not in grids else []
    cfg_path.write_text(json.dumps({**meta, "grids": grids}, indent=2))
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
            row = {"config": cfg.to_json(), "changes": changes, "setup": meta,
                   **score_results(results, gold, args.curve_max), "seconds": time.perf_counter() - t0}
            f.write(json.dumps(row) + "\n")
            f.flush()
            done[key] = row
    rows = sorted(done.values(), key=lambda r: (-r["recall"], r["avg_chunks"]))
    front = pareto(rows)
    best = best_within(rows, args.chunk_budget)
    ok = [best] if best else []
    if ok:
        (args.output / "best.json").write_text(json.dumps({"config": ok[0]["config"], "metrics": {
            k: ok[0][k] for k in ("recall", "avg_chunks", "iterations", "empty_pool", "seen_recall", "avg_seen")
            if k in ok[0]}, "curve": ok[0].get("curve"), "setup": meta}, indent=2))
    direct = direct_r_curve(retriever, texts, gold, max(args.curve_max, 30))  # @20/@30 for the Table-2 shape
    (args.output / "curve.json").write_text(json.dumps(
        {"setup": meta, "direct_r": direct,
         "efficientrag": best_per_budget(rows, range(1, args.curve_max + 1))}, indent=2))
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
    lines += ["", f"best (chunk budget {args.chunk_budget}): " + (
        json.dumps(ok[0]["changes"]) + f" max_candidates={ok[0]['config']['max_candidates']}: recall "
        f"{100 * ok[0]['recall']:.2f} with {ok[0]['avg_chunks']:.2f} chunks" if ok else "none"), ""]
    lines += curve_table(direct, best_per_budget(rows, range(1, args.curve_max + 1)))
    (args.output / "table.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
