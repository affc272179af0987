#!/usr/bin/env python
"""What indexing a corpus costs per 1,000 chunks, in plain pair forwards: the once-per-corpus half of the cost.

For each dataset the corpus is the one the benches use (its train file's contexts plus its dev file's, as
``scripts/bench_loop_cost.py`` builds it: ``RunSetup.build``); its first ``--chunks`` passages, in corpus order, are
indexed from nothing, as the shipped system (``--model``, default ``efficientrag-all``, its ``loop-<dataset>.json``)
does on first opening a corpus:

- e5-small dense: the passages encoded (bf16 autocast where :mod:`effrag.hardware` allows it, as shipped) and a flat
  FAISS index built (``effrag.retrieval.build_retriever("dense", ..., encoder=...)``, in memory);
- MiniLM dense: the same with all-MiniLM-L6-v2 (the plain MiniLM hybrid's dense leg; for comparison, not shipped);
- BM25: the ``bm25s`` index built;
- words + sub-tokens: ``EfficientRAGLoop.prepare`` without a ranker (each chunk split into words and tokenised);
- late-ranker vectors: ``EfficientRAGLoop.prepare`` with the system's late-interaction ranker (the words of the row
  above shared): each chunk's token vectors encoded, kept as 64-byte product-quantised codes and written to a
  vector store (:mod:`effrag.models.late_vectors`);
- index written: the e5-small hybrid (FAISS + BM25) saved, as the index cache keeps it.

Nothing cached is read: the retrievers are built in memory and the index and the vector store are written under a
fresh temporary folder, removed afterwards (``EFFRAG_CACHE_DIR`` is left alone: it also holds the converted e5 folder).
The *unit* is ``effrag.tuning.loop_cost.PlainForward``: one plain MiniLM-L6 (Labeler) forward per (question, chunk)
pair, over the first ``--unit-pairs`` pairs of the dev questions and their own context chunks, the faster of fp32
and bf16, one full cycle timed after each row (the machine's load drifts); pfe = seconds / unit.

    nice -n 5 .venv/bin/python scripts/bench_index_cost.py
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU figure: the dense encoders take a GPU wherever one is

SHIPPED = ("e5-small dense", "BM25", "words + sub-tokens", "late-ranker vectors", "index written")


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "CPU"


def bench(dataset: str, args, log) -> dict:
    from transformers import AutoTokenizer

    from effrag.data import Corpus
    from effrag.pipelines.efficientrag import EfficientRAGLoop, build_config, load_models
    from effrag.pipelines.efficientrag.system import open_system
    from effrag.retrieval import build_retriever
    from effrag.retrieval.encoder import Encoder
    from effrag.retrieval.hybrid import HybridRetriever
    from effrag.setup import RunSetup
    from effrag.text import chunk_text, words
    from effrag.tuning.loop_cost import PlainForward

    data = Path(args.data) / dataset
    # bench_loop_cost's corpus (RunSetup.build(dev, corpus_from=[train])), no retriever; the questions give the unit
    setup = RunSetup.build(corpus_from=[data / "train.jsonl", data / "dev.jsonl"], retriever=None).ask(
        data / "dev.jsonl", limit=args.unit_pairs)
    sample = Corpus(setup.corpus.passages[: min(args.chunks, len(setup.corpus) - 1)])  # the last one warms up
    n = len(sample)
    system = open_system(args.checkpoints, dataset=dataset)
    cfg = build_config(system.config)
    if system.ranker is None:
        raise SystemExit(f"{system.root} has no ranker folder: no late-interaction vectors to time")
    labeler, filter_model, ranker = load_models(system.labeler, system.filter, "cpu", ranker=system.ranker)
    if not hasattr(ranker, "index"):
        raise SystemExit(f"{system.ranker} is not a late-interaction ranker: it keeps no chunk vectors")
    encoders = {"e5-small": Encoder(system.encoder or "e5-small", bf16=True), "minilm": Encoder("minilm", bf16=True)}
    for enc in encoders.values():  # loaded and run once: the rows time the indexing, not the first call's set-up
        enc.encode(["warm-up"])
    last = setup.corpus.passages[-1]  # a dev context outside the sample: the late ranker's first call
    ranker.predict([setup.texts[0]], [words(chunk_text(last.title, last.text, cfg.chunk_format))], bf16=cfg.bf16)
    build_retriever("bm25", Corpus([last]), show_progress=False)  # bm25s and its stemmer imported (once a process)
    pairs = [(q.question, chunk_text(p.title, p.text, cfg.chunk_format)) for q in setup.questions for p in q.contexts]
    unit = PlainForward(labeler, pairs[: args.unit_pairs])
    unit.seconds_per_pair()  # a warm-up cycle, not counted
    texts = [chunk_text(p.title, p.text, cfg.chunk_format) for p in sample.passages]
    minilm_tokens = [len(t) for t in labeler.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]
    e5 = encoders["e5-small"]
    e5_tok = AutoTokenizer.from_pretrained(str(e5.path))
    e5_tokens = [len(t) for t in e5_tok([e5.format_passage(p.title, p.text) for p in sample.passages],
                                       add_special_tokens=False, verbose=False)["input_ids"]]
    rows, built, shared_words = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="effrag-index-cost-") as tmp:
        steps = {
            "e5-small dense": lambda: built.update(e5=build_retriever("dense", sample, encoder=e5,
                                                                      show_progress=False)),
            "MiniLM dense": lambda: build_retriever("dense", sample, encoder=encoders["minilm"], show_progress=False),
            "BM25": lambda: built.update(bm25=build_retriever("bm25", sample, show_progress=False)),
            "words + sub-tokens": lambda: built.update(words=EfficientRAGLoop(
                labeler, filter_model, built["bm25"], cfg, words=shared_words).prepare(sample.passages)),
            "late-ranker vectors": lambda: built.update(late=EfficientRAGLoop(
                labeler, filter_model, built["bm25"], cfg, ranker=ranker, words=shared_words).prepare(
                sample.passages, vector_store=Path(tmp) / "late-vectors")),
            "index written": lambda: HybridRetriever([built["e5"], built["bm25"]]).save(Path(tmp) / "index"),
        }
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            seconds = time.perf_counter() - t0
            unit_s = unit.seconds_per_pair()
            rows.append({"row": name, "seconds": seconds, "unit_s": unit_s, "unit_mode": unit.last_mode,
                         "s_per_1k": 1000 * seconds / n, "pfe_per_1k": 1000 * seconds / n / unit_s,
                         "chunks_per_s": n / seconds})
            log(f"{dataset} {name}: {seconds:.2f} s for {n} chunks, unit {1000 * unit_s:.2f} ms/pair "
                f"({unit.last_mode}), {rows[-1]['pfe_per_1k']:.0f} pfe per 1,000 chunks")
    late = built["late"]
    if late["vectors_encoded"] != n:
        raise SystemExit(f"{dataset}: {late['vectors_encoded']} late vectors encoded for {n} chunks (a cache read?)")
    shipped = [r for r in rows if r["row"] in SHIPPED]
    total = sum(r["seconds"] for r in shipped)
    unit_med = statistics.median(r["unit_s"] for r in rows)
    rows.append({"row": "shipped total", "seconds": total, "unit_s": unit_med, "s_per_1k": 1000 * total / n,
                 "pfe_per_1k": sum(r["pfe_per_1k"] for r in shipped), "chunks_per_s": n / total})
    return {"dataset": dataset, "chunks": n, "corpus_size": len(setup.corpus), "unit_pairs": unit.n,
            "system_config": system.config.name, "encoder": system.encoder, "ranker": Path(system.ranker).name,
            "codec": getattr(ranker, "codec", None) is not None, "late": late,
            "mean_tokens": {"minilm": statistics.fmean(minilm_tokens), "e5-small": statistics.fmean(e5_tokens)},
            "rows": rows}


def main(argv=None) -> int:
    from effrag.cli_args import (
        add_checkpoints_arg,
        add_data_args,
        add_output_arg,
        add_source_args,
        output_dir,
        positive_int,
    )

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_args(p, limit=False)
    add_source_args(p)
    p.add_argument("--chunks", type=positive_int, default=1000, help="the corpus's first N passages (default 1000)")
    p.add_argument("--unit-pairs", type=positive_int, default=256, help="(question, chunk) pairs timed as the unit")
    add_checkpoints_arg(p, "efficientrag-all")
    add_output_arg(p, "reports/efficientrag/index-cost", type=output_dir)
    args = p.parse_args(argv)
    import torch

    from effrag.evaluation.report import md_table
    from effrag.hardware import resolve_bf16
    from effrag.provenance import portable_text, report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    logging.getLogger("effrag.hardware").setLevel(logging.ERROR)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    results = [bench(d, args, log) for d in args.datasets]
    device = (f"{cpu_name()}, torch {torch.__version__}, torch threads {torch.get_num_threads()}, encoders in "
              f"{'bf16 autocast (native bf16)' if resolve_bf16(True, 'cpu') else 'fp32 (no native bf16)'}")
    table = md_table(["dataset", "row", "s / 1k chunks", "pfe / 1k chunks", "chunks/s", "unit ms/pair"],
                     [[r["dataset"], row["row"], f"{row['s_per_1k']:.2f}", f"{row['pfe_per_1k']:,.0f}",
                       f"{row['chunks_per_s']:.1f}", f"{1000 * row['unit_s']:.2f}"]
                      for r in results for row in r["rows"]], "llrrrr")
    lengths = "; ".join(f"{r['dataset']} {r['chunks']} of {r['corpus_size']} chunks, {r['mean_tokens']['minilm']:.0f}"
                        f" MiniLM / {r['mean_tokens']['e5-small']:.0f} e5-small sub-tokens" for r in results)
    md = "\n".join([
        "# Index-time cost per 1,000 chunks, in plain pair forwards\n",
        f"{time.strftime('%Y-%m-%d')}, commit {commit}, `python scripts/bench_index_cost.py {' '.join(sys.argv[1:])}`"
        f", {device}.\n",
        f"Each dataset's corpus is its train file's contexts plus its dev file's (as `scripts/bench_loop_cost.py` "
        f"builds it); its first {args.chunks} passages, in corpus order, are indexed from nothing, as "
        f"`{args.checkpoints}` (its `loop-<dataset>.json`) does on first opening a corpus. These are "
        "**once-per-corpus** costs: the index and the late ranker's vector store are kept on disk and reloaded at the "
        "next opening, so no question pays them. Nothing cached was read: retrievers built in memory, index and "
        "vector store written to a fresh temporary folder.\n",
        "Rows: *e5-small dense*: the passages encoded with e5-small and a flat FAISS index built (the shipped "
        "hybrid's dense leg); *MiniLM dense*: the same with all-MiniLM-L6-v2 (the plain MiniLM hybrid's, for "
        "comparison: not in the total); *BM25*: the bm25s index built; *words + sub-tokens*: each chunk split into "
        "words and tokenised for the Labeler and ranker (`EfficientRAGLoop.prepare`); *late-ranker vectors*: the "
        "late-interaction ranker's chunk token vectors encoded, kept as 64-byte product-quantised codes and written "
        "to a vector store (`prepare` with the ranker, `effrag.models.late_vectors`); *index written*: the e5-small "
        "hybrid saved as the index cache keeps it; *shipped total*: every row but MiniLM dense.\n",
        f"*unit* = one plain MiniLM-L6 (Labeler) forward per (question, chunk) pair, trained length, length-sorted "
        f"batches of 64, the faster of fp32 and bf16, over the first {args.unit_pairs} pairs of the dev questions "
        "and their own context chunks, one full cycle timed after each row; *pfe* = seconds / unit "
        "(`effrag.tuning.loop_cost.PlainForward`). The total's pfe sums its rows'; its unit is their median.\n",
        table,
        f"\nPassages (mean sub-tokens of title and text, untruncated): {lengths}.\n"])
    write_report(args.output, portable_text(md), {"commit": commit, "device": device, "datasets": results}, args=args,
                 prog="scripts/bench_index_cost.py",
                 files=[Path(args.data) / d / f for d in args.datasets for f in ("train.jsonl", "dev.jsonl")])
    print(table)
    log(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
