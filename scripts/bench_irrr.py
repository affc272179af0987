"""IRRR next to Direct-R and EfficientRAG on dev files, one retriever and one reader for all.

For each dataset the corpus pools that dataset's ``--corpus-from`` files and dev file
(train + dev contexts), indexed with BM25 (IRRR's engine). Methods:

* ``direct-r@K``: top-K for the question, answered by IRRR's reader (``IRRRReader``:
  each chunk read alone, most answerable span wins);
* ``efficientrag``: the Labeler/Filter loop (``--labeler``, ``--filter``), same reader;
* ``irrr``: the IRRR loop with its own reader and stopping rule (``--irrr-config`` options, e.g.
  ``return_k`` to return a Direct-R-sized pool ranked by IRRR's reranker).

No LLM is called, so EM/F1 compare retrieval + the same extractive reader. Per method:
recall of gold paragraphs, chunks returned, EM/F1, steps, paragraphs read by the model,
latency per question (batch 1). Resumable (``effrag.evaluation.evaluate`` per method);
writes ``OUT/report.md`` and ``OUT/report.json`` with the config.

    python scripts/bench_irrr.py --irrr checkpoints/irrr-all --labeler checkpoints/efficientrag-all-full/labeler \\
        --filter checkpoints/efficientrag-all/filter --data ../shared/data --limit 200 --output reports/irrr
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

COLUMNS = ["dataset", "method", "n", "recall", "avg_chunks", "em", "f1", "iterations", "paragraphs_read", "latency_s"]


def parse_args(argv=None):
    from effrag.cli_args import add_data_args, add_irrr_arg, add_output_arg, add_source_args, add_threads_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_irrr_arg(ap, required=True)
    ap.add_argument("--labeler", help="EfficientRAG Labeler checkpoint (EfficientRAG skipped without)")
    ap.add_argument("--filter", help="EfficientRAG Filter checkpoint")
    add_data_args(ap)
    ap.add_argument("--direct-k", type=int, nargs="+", default=[10])
    ap.add_argument("--irrr-config", action="append", default=None,
                    help='JSON IRRR loop options, e.g. {"answer_threshold": 1.0}; repeat for several IRRR rows')
    ap.add_argument("--er-config", help="EfficientRAG loop config JSON file")
    add_threads_arg(ap, 1)
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def summarise(entry: dict, pred_path: Path) -> dict:
    """The table row of a run: its metrics, the paragraphs a model read per question (IRRR's reader and
    EfficientRAG's Labeler each round's; Direct-R's reader every returned chunk) and the rounds."""
    from effrag.evaluation import read_predictions

    results = [p.result for p in read_predictions(pred_path)]
    n = max(1, len(results))
    return {**{c: entry.get(c) for c in COLUMNS}, "paragraphs_read": sum(r.chunks_read for r in results) / n,
            "iterations": sum(r.iterations for r in results) / n}


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    import torch

    torch.set_num_threads(args.threads)
    from effrag.evaluation import evaluate
    from effrag.models import IRRRModel
    from effrag.models.irrr import IRRRReader
    from effrag.pipelines import build_pipeline
    from effrag.setup import RunSetup, dataset_file

    irrr_model = IRRRModel.from_pretrained(args.irrr).eval()
    reader = IRRRReader(irrr_model)
    irrr_configs = [json.loads(c) for c in (args.irrr_config or ["{}"])]
    args.output.mkdir(parents=True, exist_ok=True)
    table = []
    for ds in args.datasets:
        dev = dataset_file(args.data, ds, "dev")
        setup = RunSetup.build(dev, limit=args.limit, corpus_from=[dataset_file(args.data, ds, "train")],
                               retriever="bm25", cache=False)
        corpus, retriever, questions, gold = setup.corpus, setup.retriever, setup.questions, setup.gold
        methods = [(f"direct-r@{k}", lambda k=k: build_pipeline("direct-r", retriever, k=k, generator=reader), None)
                   for k in args.direct_k]
        if args.labeler and args.filter:
            methods.append(("efficientrag", lambda: build_pipeline(
                "efficientrag", retriever, labeler=args.labeler, filter=args.filter, er_config=args.er_config,
                generator=reader), None))
        for opts in irrr_configs:
            label = "irrr" + "".join(f",{k}={v}" for k, v in sorted(opts.items())
                                     if k in ("answer_threshold", "query_threshold", "first_k", "return_k", "fill_order"))
            methods.append((label, lambda o=opts: build_pipeline("irrr", retriever, irrr_model=irrr_model, config=o), opts))
        for name, make, irrr_opts in methods:
            out = args.output / ds / name
            config = {"method": name, "dataset": ds, "questions": str(dev.resolve()), "limit": args.limit,
                      "retriever": "bm25", "corpus_fingerprint": corpus.fingerprint(), "reader": str(args.irrr),
                      "irrr_config": irrr_opts,
                      "labeler": args.labeler, "filter": args.filter, "er_config": args.er_config}
            t0 = time.perf_counter()
            entry = evaluate(make(), questions, gold, out, config, ks=None, batch_size=1)[0]
            row = summarise(entry, out / "predictions.jsonl")
            row["method"] = name
            table.append(row)
            print(f"{ds:9s} {name:13s} " + " ".join(f"{c}={fmt(row[c])}" for c in COLUMNS[2:])
                  + f" (wall {time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    from effrag.evaluation.report import md_table

    md = (f"Recall, EM and F1 as fractions; avg_chunks = passages returned; paragraphs_read = passages a model "
          f"read (IRRR reader and EfficientRAG Labeler); latency in s per question (batch 1, torch threads = "
          f"{args.threads}). Direct-R and EfficientRAG are answered by IRRR's reader over each returned chunk "
          f"alone (no LLM).\n\n") + md_table(COLUMNS, [[fmt(r[c]) for c in COLUMNS] for r in table])
    data = [Path(args.data) / ds / f"{split}.jsonl" for ds in args.datasets for split in ("dev", "train")]
    write_report(args.output, md, {"rows": table}, args=args, argv=argv, prog="python scripts/bench_irrr.py",
                 files=data, commit=commit)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
