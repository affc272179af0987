"""Benchmark the LLM-based methods (and Direct-R, EfficientRAG) on dev files with one LLM.

For each dataset file and method this runs :func:`effrag.evaluation.evaluate`
(resumable: predictions are appended per question under
``OUT/<dataset>/<method>/``) and writes one table of recall, chunks, EM/F1, LLM
calls, tokens, parse failures and latency per question to ``OUT/bench.md`` and
``OUT/bench.json`` (with the run config). ``cpu_s`` is process CPU time per question
(the in-process LLM included), the number to plan runs with on shared cores.

    python scripts/bench_methods.py --questions ../shared/data/hotpotqa/dev.jsonl --limit 5 \
        --llm default --output runs/bench-smollm2

The corpus pools the contexts of the given files (plus ``--corpus-from`` files)
and is indexed with BM25 (or ``--retriever dense``). Direct-R always runs;
EfficientRAG runs when ``--labeler`` and ``--filter`` are given; SearChain needs
a reader checkpoint (``--reader``, default checkpoints/reader-all) and is
skipped with a note when there is none.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LLM_METHODS = ["direct", "cot", "decompose-r", "iter-retgen", "self-ask", "ircot", "searchain", "mcr"]
COLUMNS = ["method", "dataset", "n", "recall", "avg_chunks", "em", "f1", "llm_calls", "prompt_tokens",
           "completion_tokens", "parse_failures", "latency_s", "cpu_s"]


def parse_args(argv=None):
    from effrag.cli_args import (
        add_batch_size_arg,
        add_corpus_from_arg,
        add_limit_arg,
        add_llm_arg,
        add_output_arg,
        add_questions_arg,
        add_reader_arg,
        add_retriever_arg,
        add_seed_arg,
        add_source_args,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_questions_arg(ap, nargs="+", help="dev files (original formats)")
    add_limit_arg(ap, 5, help="first N questions of each file")
    add_llm_arg(ap, "default")
    ap.add_argument("--methods", nargs="+", default=["direct-r", *LLM_METHODS, "efficientrag"])
    ap.add_argument("--k", type=int, default=None, help="chunks per retrieval (default: each method's own)")
    add_retriever_arg(ap, "bm25", choices=["bm25", "dense"])
    add_corpus_from_arg(ap, help="extra files whose contexts join the corpus")
    add_reader_arg(ap, "checkpoints/reader-all", help="SearChain reader checkpoint")
    ap.add_argument("--labeler", help="EfficientRAG Labeler checkpoint")
    ap.add_argument("--filter", help="EfficientRAG Filter checkpoint")
    ap.add_argument("--er-config", type=Path,
                    help="EfficientRAG loop config: a JSON file, or a directory holding loop-<dataset>.json per dataset "
                         "(e.g. effrag/pretrained/efficientrag-all); default: the loop's defaults")
    ap.add_argument("--method-opts", default="{}", help='JSON: {"ircot": {"reader_prompt": "cot"}, ...}')
    add_seed_arg(ap)
    add_batch_size_arg(ap, 1, of="questions per pipeline call: with an LLM that takes concurrent requests (hf:, "
                                 "openai:) the LLM methods run them in threads and the hf: backend decodes them as "
                                 "one batch")
    add_output_arg(ap, required=True, help="folder bench.md, bench.json and one run per <dataset>/<method> go to")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: tabulate the finished OUT/<dataset>/<method> runs (e.g. of a stopped bench)")
    add_source_args(ap)
    return ap.parse_args(argv)


def build(name: str, retriever, llm, dataset: str, args, extra: dict):
    from effrag.pipelines import build_pipeline
    from effrag.pipelines.generation import Generator

    k = {"k": args.k} if args.k else {}
    if name == "direct-r":
        return build_pipeline(name, retriever, k=args.k or 10, generator=Generator(llm, dataset=dataset), **extra)
    if name == "efficientrag":
        return build_pipeline(name, retriever, labeler=args.labeler, filter=args.filter,
                              er_config=loop_config(args.er_config, dataset), generator=Generator(llm, dataset=dataset),
                              **k, **extra)
    if name == "searchain":
        extra = {"reader": args.reader, **extra}
    return build_pipeline(name, retriever, llm=llm, dataset=dataset, seed=args.seed, **k, **extra)


def loop_config(path: Path | None, dataset: str) -> str | None:
    """``--er-config``: the file itself, or ``loop-<dataset>.json`` in a directory (an error if it has none)."""
    from effrag.pipelines.efficientrag.system import dataset_config

    try:
        return dataset_config(path, dataset)
    except FileNotFoundError as e:
        raise SystemExit(f"bench_methods: error: --er-config {e}") from None


def check_loop_configs(args, files: list[Path]) -> None:
    """Before the index is built and any method runs: every questions file's dataset has its loop config (a
    missing ``loop-<dataset>.json`` would otherwise stop the run after hours of the other methods)."""
    if "efficientrag" not in args.methods or not (args.labeler and args.filter):
        return
    from effrag.data import load_questions

    for f in files:
        qs = load_questions(f, None, limit=1)
        if qs:
            loop_config(args.er_config, qs[0].dataset)


class CPUTimed:
    """Adds ``cpu_s`` (process CPU seconds per question, LLM included when in process) to each output:
    unlike wall latency it does not depend on what else shares the cores."""

    slice_k = False

    def __init__(self, pipeline):
        self.pipeline, self.name = pipeline, pipeline.name

    def run_batch(self, questions: list[str]) -> list:
        c0 = time.process_time()
        outs = self.pipeline.run_batch(questions)
        per_q = (time.process_time() - c0) / max(1, len(questions))
        for o in outs:  # effrag.pipelines.Result: extra fields go into the predictions row
            o.extra["cpu_s"] = round(per_q, 3)
        return outs


def summarise(entry: dict, pred_path: Path) -> dict:
    """The table row of a run: its metrics, and the means of the methods' own row fields (parse failures, CPU s)."""
    from effrag.evaluation import read_predictions

    extra = [p.result.extra for p in read_predictions(pred_path)]

    def mean(key):
        vals = [e[key] for e in extra if e.get(key) is not None]
        return sum(vals) / len(vals) if vals else None
    return {**{c: entry.get(c) for c in COLUMNS}, "parse_failures": mean("parse_failures") or 0.0,
            "cpu_s": mean("cpu_s"), "cover_em": entry.get("cover_em"), "iterations": entry.get("iterations")}


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def speedups(table: list[dict]) -> list[str]:
    """EfficientRAG's speed-up over IRCoT and Iter-RetGen per dataset: their latency and CPU seconds per question
    divided by EfficientRAG's (issue #18), from the rows that ran."""
    lines = []
    for ds in dict.fromkeys(r["dataset"] for r in table):
        rows = {r["method"]: r for r in table if r["dataset"] == ds}
        er = rows.get("efficientrag")
        for other in ("ircot", "iter-retgen"):
            if er and other in rows:
                ratio = lambda c: (f"{rows[other][c] / er[c]:.1f}x" if rows[other].get(c) and er.get(c)  # noqa: E731
                                   else "-")
                lines.append(f"{ds}: EfficientRAG is {ratio('latency_s')} faster than {other} in latency, "
                             f"{ratio('cpu_s')} in CPU seconds per question")
    return lines


def write_report(args, table: list[dict], notes: list[str], commit: str) -> str:
    from effrag.evaluation.report import md_table
    from effrag.provenance import provenance

    notes = sorted(set(notes)) + speedups(table)
    md = md_table(COLUMNS, [[fmt(r[c]) for c in COLUMNS] for r in table]) + "".join(f"\n- {n}" for n in notes) + "\n"
    (args.output / "bench.md").write_text(md)
    (args.output / "bench.json").write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path) else v
                                                                   for k, v in vars(args).items()},
                                                        "rows": table, "notes": notes,
                                                        **provenance(prog="python scripts/bench_methods.py",
                                                                     commit=commit,
                                                                     files=[*args.questions, *args.corpus_from])},
                                                       indent=2))
    return md


def report_only(args, commit: str) -> int:
    table, notes = [], []
    for ds_dir in sorted(p for p in args.output.iterdir() if p.is_dir()):
        for name in args.methods:
            m = ds_dir / name / "metrics.json"
            if not m.is_file():
                notes.append(f"{ds_dir.name} {name}: not run (no metrics.json)")
                continue
            table.append(summarise(json.loads(m.read_text())[0], ds_dir / name / "predictions.jsonl"))
    print(write_report(args, table, notes, commit))
    return 0


def main(argv=None) -> int:
    from effrag.provenance import report_source

    args = parse_args(argv)
    if args.report_only:
        return report_only(args, report_source(args.output, args.allow_dirty))
    from effrag.evaluation import evaluate
    from effrag.llm import load_llm
    from effrag.setup import RunSetup

    method_opts = json.loads(args.method_opts)
    files = [Path(f) for f in args.questions]
    check_loop_configs(args, files)
    commit = report_source(args.output, args.allow_dirty)  # before the index is built and any method runs
    # one corpus for every file; a cached index: a resumed run does not re-encode
    pooled = RunSetup.build(corpus_from=[*files, *map(Path, args.corpus_from)], retriever=args.retriever)
    retriever = pooled.retriever
    llm = load_llm(args.llm)
    args.output.mkdir(parents=True, exist_ok=True)
    table, notes = [], []
    for f in files:
        setup = pooled.ask(f, limit=args.limit)
        questions, gold, dataset = setup.questions, setup.gold, setup.dataset
        for name in args.methods:
            if name == "efficientrag" and not (args.labeler and args.filter):
                notes.append("efficientrag skipped: give --labeler and --filter")
                continue
            extra = method_opts.get(name, {})
            try:
                pipeline = build(name, retriever, llm, dataset, args, extra)
            except FileNotFoundError as e:  # SearChain's verifier: a reader checkpoint whose weights are absent
                if name != "searchain":
                    raise
                notes.append(f"searchain skipped: {e}")
                continue
            out = args.output / dataset / name
            config = {**setup.identity(), "method": name, "dataset": dataset, "questions": str(f.resolve()),
                      "limit": args.limit, "llm": args.llm, "retriever": args.retriever, "k": args.k,
                      "method_options": extra}
            t0 = time.perf_counter()
            entry = evaluate(CPUTimed(pipeline), questions, gold, out, config, ks=None, seed=args.seed,
                             batch_size=args.batch_size)[0]
            row = summarise(entry, out / "predictions.jsonl")
            table.append(row)
            print(f"{dataset:9s} {name:12s} " + " ".join(f"{c}={fmt(row[c])}" for c in COLUMNS[2:])
                  + f" (wall {time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    print(write_report(args, table, notes, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
