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

The grid runner is :func:`effrag.tuning.run_grid`; this is its command line.

    python scripts/tune_efficientrag.py --labeler L --filter F --questions dev.jsonl --retriever dense \\
        --grid tag_threshold=0.3,0.5,0.7 token_threshold=0.3,0.5 query_mode=merged,per_chunk hop_k=5,10 \\
        --chunk-budget 10 --output runs/tune-hotpotqa
    python scripts/tune_efficientrag.py ... --grid-file effrag/configs/efficientrag_recipe.yaml   # the recipe's grid
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEFAULT_GRID = ["tag_threshold=0.3,0.5,0.7", "token_threshold=0.3,0.5", "query_mode=merged,per_chunk"]


def main(argv=None) -> int:
    from effrag.cli_args import add_batch_size_arg, add_method_args, add_output_arg, add_run_args, add_source_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, sample=True, retriever_default="dense")
    add_method_args(p, "efficientrag")
    grid = p.add_mutually_exclusive_group()
    grid.add_argument("--grid", nargs="+", default=None, metavar="NAME=V1,V2",
                      help="the grid's items (default: tag_threshold=0.3,0.5,0.7 token_threshold=0.3,0.5 "
                           "query_mode=merged,per_chunk)")
    grid.add_argument("--grid-file", type=Path, metavar="YAML",
                      help="the items from a file's `grid:` list (the recipe's: effrag/configs/efficientrag_recipe.yaml)")
    p.add_argument("--chunk-budget", type=float, default=None, help="best = highest recall with at most this many "
                   "average chunks (default: highest recall, fewer chunks on ties)")
    add_batch_size_arg(p, 64, of="questions per loop call")
    p.add_argument("--curve-max", type=int, default=10, help="recall of each pool truncated at 1..N chunks "
                   "(= max_candidates N); with --chunk-budget, truncations compete for best too")
    add_output_arg(p, required=True, help="the tuning folder (results.jsonl, resumed; best.json)")
    add_source_args(p)
    args = p.parse_args(argv)
    import logging

    from effrag.cli_args import method_options
    from effrag.pipelines import build_pipeline
    from effrag.provenance import report_source
    from effrag.setup import RunSetup
    from effrag.tuning import parse_grid, read_grid_file, run_grid, tuning_setup

    try:
        args.grid = read_grid_file(args.grid_file) if args.grid_file else args.grid or DEFAULT_GRID
        grid = parse_grid(args.grid)
    except ValueError as e:
        p.error(str(e))
    # the rows are the evidence reports commit (efficientrag_report.py): from committed code, or with the diff beside
    commit = report_source(args.output, args.allow_dirty)
    logging.getLogger("effrag.models").setLevel(logging.ERROR)  # truncation warnings on every hop are noise here
    if args.labeler is None and args.filter is None:  # a system folder (--model, or the shipped one): its checkpoints
        from effrag.pipelines.efficientrag.system import DEFAULT_SYSTEM, open_system

        system = open_system(args.model or DEFAULT_SYSTEM, args.er_config)  # the ranker --er-config names, if any
        args.labeler, args.filter, args.ranker = system.labeler, system.filter, args.ranker or system.ranker
        args.model = None
    run = RunSetup.from_args(args, own_contexts=True)
    loop = build_pipeline("efficientrag", run.retriever, **method_options(args)).loop
    setup = tuning_setup(run, args.labeler, args.filter, args.ranker, loop.config, seed=args.seed)
    result = run_grid(loop, run.texts, run.gold, grid, args.output, setup, grid_spec=args.grid,
                      chunk_budget=args.chunk_budget, batch_size=args.batch_size, curve_max=args.curve_max,
                      ids=[q.id for q in run.questions], commit=commit)
    print(result["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
