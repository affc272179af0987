#!/usr/bin/env python
"""What EfficientRAG's loop costs per question, in plain pair forwards (issues #18, #45).

For a questions file over its corpus, the shipped system's files read by name (``--model``, default
``efficientrag-all``: its ``loop-<dataset>.json``, weights and retriever, as ``effrag eval`` runs them), each
variant (the shipped config, then each cost point or option on top of it) is run batched (``--batch`` questions
per ``loop.run``) and one question at a time (the first ``--single`` questions). The *unit* is one plain MiniLM-L6
forward (the Labeler) over a (query, chunk) pair the loop read: a fixed sample of the pairs of the shipped
config's first batch, pre-tokenised at the trained length, in length-sorted batches of 64, in fp32 and in bf16
where the CPU has it, the faster of the two, one batch timed after each loop batch of every variant (the
machine's load drifts, so the unit is timed beside what it divides). The ratio is

    loop seconds per question (batched) / unit seconds per pair   (issue #45's target: <= 12)

Recall (``effrag.evaluation.metrics.recall`` at the pool's cap, vs the run's gold) and the inputs each model read
are reported beside every variant. The questions are the first ``--limit`` of the dev file: the loop configs were
chosen on dev questions, so recall here is in-sample; the cross-fitted figures are ``efficientrag_report.py``'s.
The measuring is :mod:`effrag.tuning.loop_cost`; this is its command line and report.

    nice -n 5 .venv/bin/python scripts/bench_loop_cost.py --dataset hotpotqa --limit 100
    python scripts/bench_loop_cost.py --device cuda --batch 32 --dataset hotpotqa --limit 256   # the GPU rows

With ``--device cuda`` the models and the dense leg's encoder run on the GPU, the unit's clock is read after a
device sync, and each variant warms up on a whole batch (:func:`effrag.tuning.loop_cost.warmup_size`).
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
# name -> config changes on top of the dataset's shipped loop config: the cost points the loop configs were chosen
# among (effrag/configs/efficientrag_recipe.yaml), then single options
VARIANTS = {
    "shipped": {},
    "f30-h10-r20": {"first_hop_k": 30, "hop_k": 10, "rescore_top": 20, "ranker_max_length": None},
    "f15-h10-r20": {"first_hop_k": 15, "hop_k": 10, "rescore_top": 20, "ranker_max_length": None},
    "f15-h5-r10": {"first_hop_k": 15, "hop_k": 5, "rescore_top": 10, "ranker_max_length": None},
    "f10-h5-r5": {"first_hop_k": 10, "hop_k": 5, "rescore_top": 5, "ranker_max_length": None},
    "f10-h3-r3": {"first_hop_k": 10, "hop_k": 3, "rescore_top": 3, "ranker_max_length": None},
    "f15-h5-r10-ranker128": {"first_hop_k": 15, "hop_k": 5, "rescore_top": 10, "ranker_max_length": 128},
    "f10-h5-r5-ranker128": {"first_hop_k": 10, "hop_k": 5, "rescore_top": 5, "ranker_max_length": 128},
    "ranker128": {"ranker_max_length": 128},
    "labeler128": {"labeler_max_length": 128},
    "int8": {"int8": True},
    "label-last-hop": {"label_last_hop": True},  # the Labeler reads the last hop too (the configs before 2026-11-28)
    "skip-last-labels": {"label_last_hop": False},
    "batch64": {"batch_size": 64},
    # issue #70: 5 chunks, in the pool order and in the set-wise ranker's (the system's set-ranker/)
    "cut5": {"max_candidates": 5},
    "set5": {"set_ranker_top": 10, "max_candidates": 5},
    "set5-top30": {"set_ranker_top": 30, "max_candidates": 5},
}


def main(argv=None) -> int:
    from effrag.cli_args import add_checkpoints_arg, add_data_args, add_limit_arg, add_output_arg, add_source_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = add_data_args(p, one=True, limit=False)
    add_limit_arg(g, 64, help="first N dev questions")
    p.add_argument("--batch", type=int, default=16, help="questions per loop.run in the batched run")
    p.add_argument("--single", type=int, default=8, help="questions run one at a time")
    p.add_argument("--unit-pairs", type=int, default=256, help="baseline pairs timed as the unit after each variant")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    add_checkpoints_arg(p, DEFAULT_SYSTEM, help="a system folder or shipped name (labeler/, filter/, [ranker/], "
                                                "loop-<dataset>.json)")
    p.add_argument("--general", action="store_true", help="the system's general loop.json instead of its "
                   "loop-<dataset>.json (what a corpus of your own gets)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the models run (cuda: the loop's models and the dense leg's encoder on the GPU)")
    p.add_argument("--no-prepare", dest="prepare", action="store_false",
                   help="leave the corpus unsplit and untokenised until a question reads a chunk (the loop before "
                        "EfficientRAGLoop.prepare; effrag eval and serve prepare it when they open the system)")
    add_output_arg(p, "reports/efficientrag/loop-cost")
    add_source_args(p)
    args = p.parse_args(argv)
    from effrag.provenance import report_source

    commit = report_source(args.output, args.allow_dirty)  # before any model loads: a dirty tree fails fast
    if args.device == "cpu":  # every model on the CPU, the dense leg's encoder too (it takes a GPU wherever one is)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import logging

    import torch

    from effrag.models.model_files import read_effrag_config
    from effrag.pipelines.efficientrag import build_config, load_models
    from effrag.pipelines.efficientrag.system import open_system
    from effrag.provenance import portable, portable_path, provenance
    from effrag.setup import RunSetup
    from effrag.tuning.loop_cost import measure, report

    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    logging.getLogger("effrag.hardware").setLevel(logging.ERROR)

    data = Path(args.data) / args.dataset
    device_name = (f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}" if args.device == "cuda"
                   else f"CPU, torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    system = open_system(args.checkpoints, dataset=None if args.general else args.dataset)
    kind = system.retriever or "dense"  # the retriever the loop config was tuned over
    setup = RunSetup.build(data / "dev.jsonl", corpus_from=[data / "train.jsonl"], retriever=kind, bf16=True,
                           encoder=system.encoder, limit=args.limit)  # and the encoder it was tuned over
    setup_s = time.perf_counter() - t0
    base = build_config(system.config)
    ranker_dir = system.ranker if base.pool_order == "rank" else None
    models = load_models(system.labeler, system.filter, args.device, ranker=ranker_dir)
    labeler, filter_model, ranker = models if ranker_dir is not None else (*models, None)
    ck = portable_path(system.config)
    names = ["shipped"] + [n for n in args.variants if n != "shipped"]
    print(f"setup {setup_s:.1f}s, {len(setup.texts)} questions, corpus {len(setup.corpus)}, "
          f"torch threads {torch.get_num_threads()}", file=sys.stderr)
    set_ranker = None
    if any(VARIANTS[n].get("set_ranker_top") for n in names):
        if system.set_ranker is None:
            p.error(f"{system.root} has no set-ranker/ for the variants with set_ranker_top")
        from effrag.models.set_ranker import load as load_set_ranker

        set_ranker = load_set_ranker(system.set_ranker)
    out = measure(setup, labeler, filter_model, base, {n: VARIANTS[n] for n in names}, batch=args.batch,
                  single=args.single, unit_pairs=args.unit_pairs, log=lambda m: print(m, file=sys.stderr), ranker=ranker,
                  prepare=args.prepare, set_ranker=set_ranker)
    rows = out["rows"]
    b = rows[0]
    dest = Path(args.output)
    dest.mkdir(parents=True, exist_ok=True)
    table = report(out, b["recall"])
    modes = sorted({r["unit_mode"] for r in rows})
    md = [f"# EfficientRAG loop cost: {args.dataset} dev, first {len(setup.texts)} questions\n",
          f"{time.strftime('%Y-%m-%d')}, commit {commit}, `python scripts/bench_loop_cost.py "
          f"{' '.join(sys.argv[1:])}`.\n",
          f"Shipped loop config `{ck}` (read by name from `{args.checkpoints}`), {kind} retriever"
          f"{f' over {system.encoder}' if system.encoder and kind != 'bm25' else ''} (index cached, setup "
          f"{setup_s:.1f} s), batched runs of {args.batch} questions, one-at-a-time runs of the first {args.single}, "
          f"models on the {device_name}. *unit* = one plain MiniLM-L6 (Labeler) forward per (query, "
          f"chunk) pair the loop read (trained length, length-sorted batches of 64, {args.unit_pairs} pairs), the "
          f"faster of fp32 and bf16 (here: {', '.join(modes)}), one batch timed after each loop batch of each "
          "variant; *ratio* = loop s/q ÷ unit: pair-forward equivalents per question, batched throughput (issue #45 "
          "target ≤ 12); *ratio single*: the same with the questions run one at a time, as `effrag eval` and "
          "`effrag retrieve` run them. "
          "*read/q*: the inputs each model read per question; *pairs/q*: every chunk the loop read, by any model. "
          "Stage seconds are the loop's own per-result timing (labeler includes the ranker). *Δ pts* = recall minus "
          "the shipped config's. Recall is in-sample (these dev questions chose the configs).\n",
          table,
          f"\nShipped: a plain forward over exactly the pairs it read takes {b['plain_all_s_per_q']:.3f} s/question "
          f"(loop {b['s_per_q']:.3f} s/q). Pair lengths in sub-tokens: median {b['pair_tokens']['median']}, "
          f"max {b['pair_tokens']['max']}, {100 * b['pair_tokens']['over_128']:.0f}% over 128.\n",
          (f"Index time: the corpus's {out['prepared']['passages']} chunks were split into words and tokenised "
           f"before the questions (`EfficientRAGLoop.prepare`, as `effrag eval` and `effrag serve` do on opening the "
           f"system) in {out['prepared']['seconds']:.1f} s, {1000 * out['prepared']['seconds'] / max(1, out['prepared']['passages']):.2f} ms "
           f"per chunk, {out['prepared'].get('vectors_encoded', 0)} late-interaction chunk vectors encoded (the bench "
           "keeps no vector store: a system opened again loads them, `effrag.models.late_vectors`); not in s/q.\n"
           if out["prepared"]["passages"] else
           "The corpus was not prepared (`--no-prepare`): each chunk is split and tokenised when a question first "
           "reads it, inside s/q.\n")]
    (dest / "report.md").write_text("\n".join(md))
    (dest / "report.json").write_text(json.dumps(portable(
        {"provenance": provenance(prog="scripts/bench_loop_cost.py", files=[data / "dev.jsonl"], commit=commit),
         "commit": commit,
         "setup": {**setup.identity(), "n": len(setup.texts), "batch": args.batch, "single": args.single,
                   "unit_pairs": args.unit_pairs, "threads": torch.get_num_threads(), "device": device_name,
                   "setup_s": setup_s, "prepared": out["prepared"],
                   # the ranker folder the loop read with and its trained length (the Pareto table's match)
                   "ranker": Path(ranker_dir).name if ranker_dir is not None else None,
                   "ranker_length": read_effrag_config(ranker_dir).get("max_length") if ranker_dir is not None else None,
                   "base_config": base.to_json()},
         "rows": rows}), indent=2, default=str))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
