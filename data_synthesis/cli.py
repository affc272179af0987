"""``effrag synthesize``: make EfficientRAG training data (also ``python -m data_synthesis.cli``).

    effrag synthesize --inputs train_hotpot.jsonl train_2wiki.jsonl train_musique.jsonl \\
        --output runs/synth/train_all [--source annotation|llm] [--llm SPEC] \\
        [--retriever bm25|dense|hybrid] [--corpus-from FILE...] [--no-negatives] [--limit N]

Rerunning the same command resumes an interrupted run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.cli import output_dir, positive_int as _positive_int


def add_synthesize_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("synthesize", help="synthesize Labeler/Filter training data (resumable)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE",
                   help="dataset files (HotpotQA / 2WikiMQA / MuSiQue, original formats); pooled into one output")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="output directory (resumed if it exists)")
    p.add_argument("--source", choices=["annotation", "llm"], default="annotation",
                   help="records from the datasets' annotations (default) or from an LLM (paper §3.2)")
    p.add_argument("--llm", metavar="SPEC", help="LLM for --source llm: 'default', 'gguf:PATH' or 'openai:URL#MODEL'")
    p.add_argument("--retriever", choices=["bm25", "dense", "hybrid"], default="bm25",
                   help="foundation retriever for hard negatives (default bm25)")
    p.add_argument("--corpus-from", nargs="+", metavar="FILE",
                   help="files whose contexts form the negatives' corpus (default: the inputs)")
    p.add_argument("--encoder", metavar="PATH", help="local encoder folder for dense (default all-MiniLM-L6-v2)")
    p.add_argument("--cache-dir", type=Path, help="dense index cache (default: rebuild in memory)")
    p.add_argument("--no-negatives", dest="negatives", action="store_false", help="skip hard negatives")
    p.add_argument("--neg-k", type=_positive_int, default=10, help="hits searched per query for a negative")
    p.add_argument("--neg-per-query", type=_positive_int, default=1, help="hard negatives per query (paper: 1)")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="only the first N questions of each input")
    p.add_argument("--batch-size", type=_positive_int, help="questions per negatives search (default 64; llm 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    p.set_defaults(func=run_synthesize)
    return p


def run_synthesize(args) -> dict:
    """Handler of ``effrag synthesize``; ValueError / FileNotFoundError are user errors."""
    from .pipeline import synthesize

    for f in [*args.inputs, *(args.corpus_from or [])]:
        if not Path(f).is_file():
            raise FileNotFoundError(f"input file not found: {f}")
    llm = None
    if args.source == "llm":
        if not args.llm:
            raise ValueError("--source llm needs --llm SPEC ('default', 'gguf:PATH' or 'openai:URL#MODEL')")
        from effrag.llm import load_llm

        llm = load_llm(args.llm)
    elif args.llm:
        raise ValueError("--llm is only used with --source llm")
    result = synthesize(args.inputs, args.output, source=args.source, llm=llm, retriever=args.retriever,
                        negatives=args.negatives, limit=args.limit, corpus_from=args.corpus_from,
                        batch_size=args.batch_size, neg_k=args.neg_k, per_query=args.neg_per_query, cache_dir=args.cache_dir,
                        encoder_path=args.encoder, show_progress=not args.quiet)
    if args.quiet:
        print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m data_synthesis.cli ...`` is ``effrag synthesize ...`` (same parser, errors and exit codes)."""
    from effrag.cli import main as effrag_main

    argv = list(sys.argv[1:] if argv is None else argv)
    return effrag_main(argv if argv[:1] == ["synthesize"] else ["synthesize", *argv])


if __name__ == "__main__":
    sys.exit(main())
