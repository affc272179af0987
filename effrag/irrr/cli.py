"""``effrag irrr-data``: build IRRR training steps from dataset files (thin layer over ``effrag.irrr.data``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli import output_dir


def add_irrr_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("irrr-data", help="build IRRR training data with the dynamic oracle (resumable)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE",
                   help="training files (HotpotQA / 2WikiMQA / MuSiQue, original formats); pooled into one output")
    p.add_argument("--corpus-from", nargs="+", metavar="FILE",
                   help="files whose contexts form the BM25 corpus (default: the inputs)")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="output directory (resumed if it exists)")
    p.add_argument("--candidates", type=int, default=5, help="reranker candidates per step (paper: 5)")
    p.add_argument("--augment-p", type=float, default=0.3,
                   help="probability of extending a path with a non-gold paragraph (recovery queries)")
    p.add_argument("--article-bm25", action="store_true",
                   help="add the paper's article score to BM25 (Appendix B: IDF^2, b=0 over the whole article)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N questions of each input")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_irrr_data)
    return p


def run_irrr_data(args) -> dict:
    from ..data import build_corpus, load_questions
    from ..retrieval.bm25 import BM25Retriever
    from .data import build_irrr_data

    for f in [*args.inputs, *(args.corpus_from or [])]:
        if not Path(f).is_file():
            raise FileNotFoundError(f"input file not found: {f}")
    if not 0.0 <= args.augment_p <= 1.0:
        raise ValueError(f"--augment-p must be in [0, 1], got {args.augment_p}")
    if args.candidates < 1:
        raise ValueError(f"--candidates must be positive, got {args.candidates}")
    questions = [q for f in args.inputs for q in load_questions(f, limit=args.limit)]
    corpus = build_corpus(args.corpus_from or args.inputs)
    bm25 = BM25Retriever(corpus, article=args.article_bm25, show_progress=not args.quiet)
    stats = build_irrr_data(questions, corpus, bm25, args.output, candidates=args.candidates,
                            augment_p=args.augment_p, seed=args.seed, progress=not args.quiet)
    out = Path(args.output)
    (out / "build_config.json").write_text(json.dumps(
        {"inputs": args.inputs, "corpus_from": args.corpus_from or args.inputs, "candidates": args.candidates,
         "augment_p": args.augment_p, "limit": args.limit, "seed": args.seed,
         "corpus_fingerprint": corpus.fingerprint(), "bm25": bm25.opts}, indent=2) + "\n")
    if not args.quiet:
        print(json.dumps(stats, indent=2))
    return stats
