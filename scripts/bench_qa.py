"""EfficientRAG's Table 3 with no LLM: every retrieval method's pool answered by one extractive reader.

    python scripts/bench_qa.py --reader checkpoints/reader-all --data ../shared/data --output reports/reader/table3

Per dataset (its dev file; corpus = its train + dev contexts; the dense MiniLM retriever for every
method, as in the project's EfficientRAG figures):

* ``direct-r@K`` (``--direct-k``, default 10 and 20): the top K chunks for the question;
* ``efficientrag``: the Labeler/Filter loop of ``--model`` (default: the shipped ``efficientrag-all``)
  with that dataset's tuned ``loop-<dataset>.json``;
* ``efficientrag+kept``: the same pool, the reader reading only the words the Labeler kept
  (EfficientRAG's compression; the loop runs once for both rows);
* ``irrr`` (with ``--irrr DIR``; loop options from ``--irrr-config FILE``, e.g. the recall-tuned
  ``reports/archive/irrr/recall/best.json``): IRRR's loop on BM25, its returned paragraphs read by the same reader.

Every pool is read by :class:`effrag.pipelines.generation.ReaderGenerator` (packed windows, the
most confident answers; ``--reader-mode each`` reads chunk by chunk). EM/F1 follow each
dataset's official rule. Each method's run is an ``effrag eval``-style folder (``predictions.jsonl``,
``metrics.json``; a killed run resumes); ``report.md`` / ``report.json`` hold the table.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

COLUMNS = ["dataset", "method", "n", "recall", "avg_chunks", "em", "f1", "context_words", "latency_s"]


def parse_args(argv=None):
    from effrag.cli_args import (
        add_data_args,
        add_irrr_arg,
        add_output_arg,
        add_reader_arg,
        add_source_args,
        add_threads_arg,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reader_arg(ap, required=True)
    ap.add_argument("--model", metavar="DIR", default=None,
                    help="EfficientRAG folder with labeler/, filter/, loop-<dataset>.json (default: the shipped "
                         "efficientrag-all)")
    add_irrr_arg(ap, help="IRRR checkpoint: adds an irrr row (BM25)")
    ap.add_argument("--irrr-config", metavar="FILE", type=Path, default=None,
                    help="IRRR loop options as JSON (e.g. reports/archive/irrr/recall/best.json); default: IRRR's defaults")
    add_data_args(ap)
    ap.add_argument("--direct-k", type=int, nargs="+", default=[10, 20])
    ap.add_argument("--reader-mode", choices=("together", "each"), default="together")
    add_threads_arg(ap)
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


class Answered:
    """A retrieval pipeline whose results are answered by ``generator``; ``shared`` memoises the
    retrieval by question, so two readings of one pool (chunks, kept words) run the loop once."""

    slice_k = False

    def __init__(self, name: str, pipeline, generator, shared: dict | None = None):
        self.name, self.pipeline, self.generator = name, pipeline, generator
        self.shared = shared if shared is not None else {}

    def run_batch(self, questions: list[str]):
        from effrag.pipelines.generation import answer_results

        todo = [q for q in questions if q not in self.shared]
        if todo:
            t0 = time.perf_counter()
            for q, r in zip(todo, self.pipeline.run_batch(todo)):
                self.shared[q] = (r, (time.perf_counter() - t0) / len(todo))
        from effrag.pipelines.generation import chunk_context

        results = []
        for q in questions:
            r, seconds = self.shared[q]
            r = copy.deepcopy(r)
            reply = answer_results(self.generator, [r])[0]
            # what the reader was given (words of whole chunks or kept words) and the time of both stages
            r.generation = reply.get("trace")
            r.extra.update(retrieval_s=round(seconds, 4),
                           reading_s=round(reply.get("latency_s", 0.0), 4),
                           context_words=sum(len(chunk_context(c, self.generator.context).split()) for c in r.chunks))
            results.append(r)
        return results


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    import torch

    from effrag.evaluation import evaluate, read_predictions
    from effrag.evaluation.report import md_table
    from effrag.hardware import usable_cores
    from effrag.models import load_reader
    from effrag.pipelines import build_pipeline
    from effrag.pipelines.generation import ReaderGenerator
    from effrag.pipelines.irrr import read_irrr_config
    from effrag.pretrained import pretrained_path
    from effrag.setup import RunSetup, dataset_file
    from effrag.tuning import model_fingerprint

    try:
        irrr_config = read_irrr_config(args.irrr_config)
    except ValueError as e:
        raise SystemExit(f"--irrr-config {e}") from None
    torch.set_num_threads(args.threads or usable_cores())
    reader = load_reader(args.reader).eval()
    together = args.reader_mode == "together"
    read_chunks = ReaderGenerator(reader, together=together)
    read_kept = ReaderGenerator(reader, together=together, context="kept_words")
    model = Path(args.model) if args.model else pretrained_path("efficientrag-all")
    args.output.mkdir(parents=True, exist_ok=True)
    table = []
    for ds in args.datasets:
        dev = dataset_file(args.data, ds, "dev")
        setup = RunSetup.build(dev, limit=args.limit, corpus_from=[dataset_file(args.data, ds, "train")],
                               retriever="dense")
        retriever = setup.retriever
        methods = [(f"direct-r@{k}", Answered(f"direct-r@{k}", build_pipeline("direct-r", retriever, k=k), read_chunks))
                   for k in args.direct_k]
        loop_config = model / f"loop-{ds}.json"
        er = build_pipeline("efficientrag", retriever, labeler=str(model / "labeler"), filter=str(model / "filter"),
                            er_config=str(loop_config))
        shared: dict = {}
        methods += [("efficientrag", Answered("efficientrag", er, read_chunks, shared)),
                    ("efficientrag+kept", Answered("efficientrag+kept", er, read_kept, shared))]
        if args.irrr:
            bm25 = RunSetup.build(dev, limit=args.limit, corpus_from=[dataset_file(args.data, ds, "train")],
                                  retriever="bm25", cache=False).retriever
            methods.append(("irrr", Answered("irrr", build_pipeline("irrr", bm25, irrr_model=args.irrr,
                                                                      config=irrr_config), read_chunks)))
        for name, pipe in methods:
            out = args.output / ds / name
            config = {"method": name, "dataset": ds, "questions": str(Path(dev).resolve()), "limit": args.limit,
                      "retriever": "bm25" if name == "irrr" else "dense", **setup.identity(),
                      "reader": str(args.reader), "reader_mode": args.reader_mode,
                      "reader_model": model_fingerprint(args.reader, with_options=True),  # retrained: no resume
                      "model": str(model) if name.startswith("efficientrag") else None,
                      "irrr": args.irrr if name == "irrr" else None,
                      "irrr_config": irrr_config if name == "irrr" else None}
            t0 = time.perf_counter()
            entry = evaluate(pipe, setup.questions, setup.gold, out, config, ks=None, batch_size=1)[0]
            done = [p.result.extra for p in read_predictions(out)]
            n = max(1, len(done))
            row = {**{c: entry.get(c) for c in COLUMNS}, "method": name, "dataset": ds,
                   "context_words": sum(r["context_words"] for r in done) / n,
                   "latency_s": sum(r["retrieval_s"] + r["reading_s"] for r in done) / n}
            table.append(row)
            print(f"{ds:9s} {name:18s} " + " ".join(f"{c}={row[c]}" for c in COLUMNS[2:])
                  + f" (wall {time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)

    def fmt(c, v):
        if v is None:
            return "-"
        if c in ("recall", "em", "f1"):
            return f"{100 * v:.1f}"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    def shown(path: Path) -> str:  # repo-relative where it can be, so reports read the same on every machine
        try:
            return str(path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(path)

    command = "python scripts/bench_qa.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = ("# QA with one extractive reader for every retrieval method (EfficientRAG's Table 3, no LLM)\n\n"
          f"Reader `{args.reader}` ({args.reader_mode}); EfficientRAG `{shown(model)}` with `loop-<dataset>.json`; "
          "dense MiniLM retriever (IRRR: BM25); corpus = the dataset's train + dev contexts. Recall, EM, F1 in %; "
          "context_words = words the reader was given per question; latency = s per question, retrieval + "
          "reading (the two EfficientRAG rows share one loop run, each counted with its time).\n\n" + md_table(COLUMNS, [[fmt(c, r[c]) for c in COLUMNS] for r in table])
          + f"\n\nCommand: `{command}`\n")
    data = [Path(args.data) / ds / f"{split}.jsonl" for ds in args.datasets for split in ("dev", "train")]
    write_report(args.output, md, {"rows": table}, args=args, argv=argv, prog="python scripts/bench_qa.py", files=data,
                 commit=commit)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
