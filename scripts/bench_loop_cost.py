#!/usr/bin/env python
"""What EfficientRAG's loop costs per question, in plain Labeler forwards (issue #18).

For a questions file over its corpus, the trained Labeler/Filter and the dataset's loop config, each
variant (the baseline config, then each cost option turned on) is run batched (``--batch`` questions per
``loop.run``) and one question at a time (the first ``--single`` questions). Every (query, chunk) pair the
Labeler read is taken from the trace; the *unit* is one plain fp32 forward of the Labeler over a pair:
a fixed sample of the pairs of the baseline's first batch, pre-tokenised at the trained length, in
length-sorted batches of 64, one batch timed after each loop batch of every variant (the machine's load
drifts, so the unit is timed beside what it divides). The ratio is

    loop seconds per question (batched) / unit seconds per pair   (the issue's target: <= 17)

Recall (``effrag.evaluation.metrics.recall`` vs the run's gold) is reported beside every variant, so the
rule "within 0.5 points of the baseline" is visible, and so is whether its pools equal the baseline's. The
measuring is :mod:`effrag.tuning.loop_cost`; this is its command line and report.

    nice -n 5 .venv/bin/python scripts/bench_loop_cost.py --dataset hotpotqa --limit 64
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_SYSTEM = "efficientrag-all"  # the shipped system, as a user runs it
# name -> config changes on top of the dataset's loop config
VARIANTS = {
    "baseline": {},
    "batch64": {"batch_size": 64},
    "prune_last_hop": {"prune_last_hop": True},
    "len128": {"labeler_max_length": 128},
    "int8": {"int8": True},
    "int8+len128": {"int8": True, "labeler_max_length": 128},
    "int8+len128+prune+b64": {"int8": True, "labeler_max_length": 128, "prune_last_hop": True, "batch_size": 64},
    "stop_at_pool7": {"stop_at_pool": 7},
}


def main(argv=None) -> int:
    import logging

    import torch

    from effrag.setup import RunSetup
    from effrag.pipelines.efficientrag import build_config, load_models
    from effrag.tuning.loop_cost import measure, report
    from effrag.pipelines.efficientrag_system import open_system
    from effrag.provenance import portable, portable_path
    from effrag.provenance import provenance

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="hotpotqa")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--limit", type=int, default=64, help="first N dev questions")
    p.add_argument("--batch", type=int, default=16, help="questions per loop.run in the batched run")
    p.add_argument("--single", type=int, default=8, help="questions run one at a time")
    p.add_argument("--unit-pairs", type=int, default=256, help="baseline pairs timed as the unit after each variant")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--checkpoints", "--model", dest="checkpoints", default=DEFAULT_SYSTEM,
                   help="a system folder or shipped name (labeler/, filter/, [ranker/], loop-<dataset>.json)")
    p.add_argument("--output", default="reports/efficientrag/loop-cost")
    args = p.parse_args(argv)
    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    logging.getLogger("effrag.hardware").setLevel(logging.ERROR)

    data = Path(args.data_dir) / args.dataset
    t0 = time.perf_counter()
    system = open_system(args.checkpoints, dataset=args.dataset)
    kind = system.retriever or "dense"  # the retriever the loop config was tuned over
    setup = RunSetup.build(data / "dev.jsonl", corpus_from=[data / "train.jsonl"], retriever=kind, bf16=True,
                           limit=args.limit)
    setup_s = time.perf_counter() - t0
    base = build_config(system.config)
    ranker_dir = system.ranker if base.pool_order == "rank" else None
    models = load_models(system.labeler, system.filter, "cpu", ranker=ranker_dir)
    labeler, filter_model, ranker = models if ranker_dir is not None else (*models, None)
    ck = portable_path(system.config)
    names = ["baseline"] + [n for n in args.variants if n != "baseline"]
    print(f"setup {setup_s:.1f}s, {len(setup.texts)} questions, corpus {len(setup.corpus)}, "
          f"torch threads {torch.get_num_threads()}", file=sys.stderr)
    out = measure(setup, labeler, filter_model, base, {n: VARIANTS[n] for n in names}, batch=args.batch,
                  single=args.single, unit_pairs=args.unit_pairs, log=lambda m: print(m, file=sys.stderr), ranker=ranker)
    rows = out["rows"]
    b = rows[0]
    dest = Path(args.output)
    dest.mkdir(parents=True, exist_ok=True)
    table = report(out, b["recall"])
    md = [f"# EfficientRAG loop cost: {args.dataset} dev, first {len(setup.texts)} questions\n",
          f"Loop config `{ck}`, {kind} retriever (index cached, setup {setup_s:.1f} s), "
          f"batched runs of {args.batch} questions, one-at-a-time runs of the first {args.single}, "
          f"torch threads {torch.get_num_threads()}. *unit* = one plain fp32 Labeler forward per pair "
          f"(trained length, length-sorted batches of 64, {args.unit_pairs} pairs), "
          "one batch timed after each loop batch of each variant (the unit sample: pairs of the baseline's "
          "first batch); *ratio* = loop s/q ÷ unit (issue #39 target ≤ 12). *read/q*: the inputs each model read per "
          "question; *pairs/q*: every chunk the loop read, by any model. Stage seconds "
          "are the loop's own per-result timing. *Δ pts* = recall minus the baseline's (rule: ≥ -0.5).\n",
          table,
          f"\nBaseline: a plain forward over exactly the pairs it read takes {b['plain_all_s_per_q']:.3f} s/question "
          f"(loop {b['s_per_q']:.3f} s/q: {100 * (b['s_per_q'] / b['plain_all_s_per_q'] - 1):.0f}% on top). "
          f"Baseline pair lengths in sub-tokens: median {b['pair_tokens']['median']}, "
          f"max {b['pair_tokens']['max']}, {100 * b['pair_tokens']['over_128']:.0f}% over 128.\n"]
    (dest / "report.md").write_text("\n".join(md))
    (dest / "report.json").write_text(json.dumps(portable(
        {"provenance": provenance(prog="scripts/bench_loop_cost.py", files=[data / "dev.jsonl"]),
         "setup": {**setup.describe(), "n": len(setup.texts), "batch": args.batch, "single": args.single,
                   "unit_pairs": args.unit_pairs, "threads": torch.get_num_threads(), "setup_s": setup_s,
                   "base_config": base.to_json()},
         "rows": rows}), indent=2, default=str))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
