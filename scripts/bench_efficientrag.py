#!/usr/bin/env python
"""Table-4 style efficiency report for EfficientRAG (paper §5.2).

Per question, one at a time: latency, iterations, LLM calls (0 for retrieval, 1
with ``--llm``), and the loop time split into retrieval, Labeler forward, Filter
forward and the rest (tokenisation, bookkeeping). The Labeler/Filter inputs of
that run are recorded and replayed as pure forward passes (pre-tokenised,
pre-padded, same batches), so "model forward" is separated from the Python
around it. Batched mode gives questions/s. Direct-R over the same retriever is
the reference row. Writes ``bench.md``, ``bench.json`` and ``per_question.jsonl``.

    python scripts/bench_efficientrag.py --labeler checkpoints/efficientrag-all/labeler \\
        --filter checkpoints/efficientrag-all/filter --questions ../shared/data/musique/dev.jsonl \\
        --retriever dense --n 200 --output runs/bench-musique [--llm default]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def setup(args):
    """(run setup, EfficientRAG pipeline) from the options of ``effrag.cli_args.add_run_args`` + the method's."""
    import logging

    from effrag.cli_args import method_options
    from effrag.pipelines import build_pipeline
    from effrag.setup import RunSetup

    # predict() warns about truncated chunks on every call; in a loop over hundreds of hops that is noise
    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    run = RunSetup.from_args(args, own_contexts=True)
    return run, build_pipeline("efficientrag", run.retriever, **method_options(args))


class Recorder:
    """Passes ``predict`` through to a real model and keeps its inputs for the forward-only replay."""

    def __init__(self, model):
        self.model, self.calls, self.on = model, [], True

    def predict(self, *args, **kwargs):
        if self.on:
            self.calls.append((args, kwargs))
        return self.model.predict(*args, **kwargs)


def forward_only_seconds(model, calls, kind: str) -> float:
    """Time of the bare ``model(**batch)`` calls for recorded inputs, batched as ``predict`` batches them."""
    import torch

    from effrag.models.tokenization import length_batches, pad_batch
    from effrag.text import words_batch

    total = 0.0
    for args, kw in calls:
        if kind == "labeler":
            enc = model.encode(words_batch(list(args[0])), [list(c) for c in args[1]], max_length=kw.get("max_length"))
        else:
            enc = model.encode([list(w) for w in args[0]], max_length=kw.get("max_length"))
        for idx in length_batches([len(e.input_ids) for e in enc], kw.get("batch_size", 32)):
            batch = pad_batch([enc[i].features() for i in idx], model.tokenizer.pad_token_id)
            batch.pop("labels")
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(kw.get("bf16"))):
                t0 = time.perf_counter()
                model(**batch)
                total += time.perf_counter() - t0
    return total


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def main(argv=None) -> int:
    from effrag.cli_args import (
        add_batch_size_arg,
        add_llm_arg,
        add_method_args,
        add_output_arg,
        add_run_args,
        add_source_args,
        add_threads_arg,
    )

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, sample=True, retriever_default="dense")
    add_method_args(p, "efficientrag")
    add_batch_size_arg(p, 32, of="questions per loop call in batched mode")
    add_llm_arg(p, help="LLM spec for the answer step (e.g. 'default'); omitted = retrieval only")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    add_threads_arg(p, unset="torch's choice")
    add_output_arg(p, required=True, help="folder bench.json, bench.md and per_question.jsonl are written to")
    add_source_args(p)
    args = p.parse_args(argv)
    from effrag.provenance import provenance, report_source

    commit = report_source(args.output, args.allow_dirty)
    import torch

    from effrag.evaluation.metrics import recall

    if args.threads:
        torch.set_num_threads(args.threads)

    run, pipe = setup(args)
    questions, gold, corpus, retriever = run.questions, run.gold, run.corpus, run.retriever
    loop = pipe.loop
    k = loop.config.hop_k
    generator = None
    if args.llm:
        from effrag.llm import load_llm
        from effrag.pipelines.generation import Generator

        generator = Generator(load_llm(args.llm, cache=False), dataset=args.dataset or questions[0].dataset,
                              max_tokens=args.max_tokens)
    texts = [q.question for q in questions]
    loop.run(texts[: args.warmup])  # first calls pay one-off costs (spaCy load, allocator, thread pools)
    retriever.search(texts[: args.warmup], k)

    lab, fil = Recorder(loop.labeler), Recorder(loop.filter)
    loop.labeler, loop.filter = lab, fil
    rows = []
    for q, text, g in zip(questions, texts, gold):
        t0 = time.perf_counter()
        r = loop.run([text])[0]
        t_loop = time.perf_counter() - t0
        row = {"qid": q.id, "latency_s": t_loop, "iterations": r.iterations, "chunks": len(r.chunks),
               "recall": recall([c.id for c in r.chunks], g), "llm_calls": 0, **{f"t_{k_}": v for k_, v in r.timing.items()}}
        t0 = time.perf_counter()
        hits = retriever.search([text], k)[0]
        row["direct_r_latency_s"] = time.perf_counter() - t0
        row["direct_r_recall"] = recall([h.id for h in hits], g)
        if generator is not None:
            ge = generator.generate(text, r.chunks)
            gd = generator.generate(text, hits)
            row.update(llm_calls=1, t_generation=ge.latency_s, latency_s=t_loop + ge.latency_s,
                       direct_r_latency_s=row["direct_r_latency_s"] + gd.latency_s,
                       prompt_tokens=ge.prompt_tokens, direct_r_prompt_tokens=gd.prompt_tokens)
        rows.append(row)
    lab.on = fil.on = False
    raw_lab = forward_only_seconds(lab.model, lab.calls, "labeler") / len(rows)
    raw_fil = forward_only_seconds(fil.model, fil.calls, "filter") / len(rows)
    loop.labeler, loop.filter = lab.model, fil.model

    t0 = time.perf_counter()
    for i in range(0, len(texts), args.batch_size):
        loop.run(texts[i: i + args.batch_size])
    t_batched = time.perf_counter() - t0

    n = len(rows)
    summary = {
        "n": n, "dataset": questions[0].dataset, "retriever": getattr(retriever, "kind", type(retriever).__name__),
        "corpus_size": len(corpus), "config": loop.config.to_json(), "llm": args.llm,
        "efficientrag": {"llm_calls": mean(r["llm_calls"] for r in rows), "iterations": mean(r["iterations"] for r in rows),
                         "latency_s": mean(r["latency_s"] for r in rows),
                         "latency_p50_s": statistics.median(r["latency_s"] for r in rows),
                         "chunks": mean(r["chunks"] for r in rows), "recall": mean(r["recall"] for r in rows),
                         "breakdown_s": {part: mean(r.get(f"t_{part}", 0.0) for r in rows)
                                         for part in ("retrieval", "labeler", "filter", "other", "generation")},
                         "raw_forward_s": {"labeler": raw_lab, "filter": raw_fil},
                         "labeler_calls": len(lab.calls), "labeler_pairs_per_q": sum(len(a[0]) for a, _ in lab.calls) / n,
                         "filter_inputs_per_q": sum(len(a[0]) for a, _ in fil.calls) / n,
                         "sequential_qps": n / sum(r["latency_s"] - r.get("t_generation", 0.0) for r in rows),
                         "batched_qps": n / t_batched, "batch_size": args.batch_size},
        "direct_r": {"k": k, "llm_calls": 1 if args.llm else 0, "iterations": 1,
                     "latency_s": mean(r["direct_r_latency_s"] for r in rows), "chunks": k,
                     "recall": mean(r["direct_r_recall"] for r in rows)},
        "environment": {"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "torch": torch.__version__,
                        "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        **provenance(argv=argv, commit=commit),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "bench.json").write_text(json.dumps(summary, indent=2))
    with (args.output / "per_question.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (args.output / "bench.md").write_text(render_md(summary))
    print(render_md(summary))
    return 0


def render_md(s: dict) -> str:
    from effrag.evaluation.report import md_table

    e, d = s["efficientrag"], s["direct_r"]
    b, raw = e["breakdown_s"], e["raw_forward_s"]
    ms = lambda x: f"{1000 * x:.1f}"  # noqa: E731
    lines = [
        f"# EfficientRAG efficiency ({s['dataset']}, {s['n']} questions, {s['retriever']} over "
        f"{s['corpus_size']} passages, LLM: {s['llm'] or 'none'})", "",
        md_table(["Method", "# LLM calls", "# Iteration", "Latency (s)", "# Chunks", "Recall"], [
            [f"Direct-R@{d['k']}", f"{d['llm_calls']:.2f}", "-", f"{d['latency_s']:.4f}", d["chunks"],
             f"{100 * d['recall']:.2f}"],
            ["EfficientRAG", f"{e['llm_calls']:.2f}", f"{e['iterations']:.2f}", f"{e['latency_s']:.4f}",
             f"{e['chunks']:.2f}", f"{100 * e['recall']:.2f}"]], "lrrrrr"),
        "Where EfficientRAG's time goes, per question (ms):", "",
        md_table(["retrieval", "Labeler forward", "Filter forward", "other", "generation", "total"],
                 [[ms(b["retrieval"]), ms(b["labeler"]), ms(b["filter"]), ms(b["other"]), ms(b["generation"]),
                   ms(e["latency_s"])]], "rrrrrr"),
        f"Pure model forward passes on the same batches (no tokenisation): Labeler {ms(raw['labeler'])} ms, "
        f"Filter {ms(raw['filter'])} ms per question ({e['labeler_pairs_per_q']:.1f} (query, chunk) pairs and "
        f"{e['filter_inputs_per_q']:.2f} Filter inputs per question).", "",
        f"Throughput (retrieval only): {e['sequential_qps']:.2f} questions/s one at a time, "
        f"{e['batched_qps']:.2f} questions/s batched ({e['batch_size']} per call).", "",
        f"Environment: {s['environment']['cpus']} CPUs, {s['environment']['torch_threads']} torch threads, "
        f"load average {s['environment']['load_avg']:.2f} at the end; config {json.dumps(s['config'])}.", "",
        f"Command: `{s['command']}`", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
