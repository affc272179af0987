"""Direct-R baseline: Recall@k of one retrieval per question, dense (MiniLM) and BM25.

For each dataset the corpus pools the contexts of its train and dev files; the
dev questions are evaluated at every k from one retrieval at the largest k.
Indexes are cached by corpus + encoder fingerprint and predictions resume, so a
rerun is quick and an interrupted one continues.

    nice python scripts/bench_direct_r.py --output reports/direct_r

writes ``report.md`` and ``report.json`` there, plus one evaluation folder per
(dataset, retriever) under ``runs/`` (predictions.jsonl, metrics.json, config.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see effrag.retrieval.encoder

from effrag.evaluation import evaluate, markdown_table
from effrag.pipelines import build_pipeline
from effrag.provenance import provenance, report_source
from effrag.setup import RunSetup, dataset_file


def run(args) -> list[dict]:
    entries: list[dict] = []
    for ds in args.datasets:
        train, dev = dataset_file(args.data, ds, "train"), dataset_file(args.data, ds, "dev")
        for kind in args.retrievers:
            t0 = time.perf_counter()
            setup = RunSetup.build(dev, limit=args.limit, corpus_from=[train], retriever=kind, encoder=args.encoder,
                                   bf16=args.bf16, cache_dir=args.cache_dir)
            questions, gold, corpus = setup.questions, setup.gold, setup.corpus
            index_s = time.perf_counter() - t0
            pipeline = build_pipeline("direct-r", setup.retriever, k=max(args.k))
            config = {"method": "direct-r", "dataset": ds, "retriever": kind, "questions": str(dev),
                      "corpus_from": [str(train), str(dev)], "corpus_fingerprint": corpus.fingerprint(),
                      "corpus_size": len(corpus), "encoder": args.encoder, "bf16": args.bf16 if kind != "bm25" else None,
                      "k": sorted(args.k), "limit": args.limit, "batch_size": args.batch_size}
            got = evaluate(pipeline, questions, gold, args.output / "runs" / f"{ds}-{kind}", config,
                           ks=args.k, batch_size=args.batch_size)
            for e in got:
                e.update(corpus_size=len(corpus), index_load_or_build_s=round(index_s, 1))
            entries.extend(got)
            print(markdown_table(got), end="", flush=True)
    return entries


def write_report(entries: list[dict], args, argv: list[str], commit: str) -> None:
    args.output.mkdir(parents=True, exist_ok=True)
    prov = provenance(argv=argv, prog="python scripts/bench_direct_r.py", commit=commit)
    command = prov["command"]
    (args.output / "report.json").write_text(json.dumps({**prov, "entries": entries}, indent=2))
    lines = [
        "# Direct-R retrieval baseline", "",
        "One retrieval per dev question at the largest k, scored at every k (Recall = fraction of gold "
        "passages retrieved). Corpus per dataset = contexts of its train + dev files.",
        f"Dense: {args.encoder or 'all-MiniLM-L6-v2'}, {'bf16 autocast' if args.bf16 else 'fp32'}, FAISS flat inner "
        "product; hybrid: dense + BM25, reciprocal rank fusion. "
        "BM25: bm25s (k1=1.2, b=0.75), title + text, English stopwords, Snowball stemmer when PyStemmer is installed.",
        f"Latency: per question, {'true (batch size 1)' if args.batch_size == 1 else f'amortised over batches of {args.batch_size}'}"
        "; the 2 CPU cores here are shared, so treat it as an upper bound.", "",
        markdown_table(entries), f"Command: `{command}`", "",
    ]
    (args.output / "report.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    from effrag.cli_args import (
        add_batch_size_arg,
        add_bf16_arg,
        add_cache_dir_arg,
        add_data_args,
        add_encoder_arg,
        add_output_arg,
        add_source_args,
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_args(p)
    p.add_argument("--retrievers", nargs="+", default=["dense", "bm25"], choices=["dense", "bm25", "hybrid"])
    p.add_argument("--k", nargs="+", type=int, default=[10, 20, 30])
    add_encoder_arg(p)
    add_bf16_arg(p, default=True, help="fp32 encoding (default: bf16 autocast)")
    add_batch_size_arg(p, 1, of="questions per retrieval call (1 = true latency)")
    add_cache_dir_arg(p)
    add_output_arg(p, "reports/direct_r")
    add_source_args(p)
    args = p.parse_args(argv)
    if min(args.k) <= 0:
        p.error("--k values must be positive")
    commit = report_source(args.output, args.allow_dirty)
    write_report(run(args), args, argv, commit)
    print(f"wrote {args.output / 'report.md'} and report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
