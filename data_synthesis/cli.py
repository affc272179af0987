"""``effrag synthesize``: make EfficientRAG training data (also ``python -m data_synthesis.cli``).

    effrag synthesize --inputs train_hotpot.jsonl train_2wiki.jsonl train_musique.jsonl \\
        --output runs/synth/train_all [--source annotation|llm] [--llm SPEC] \\
        [--retriever bm25|dense|hybrid] [--corpus-from FILE...] [--no-negatives] [--skip-answer-negatives] [--context-negatives N] [--limit N]

Rerunning the same command resumes an interrupted run.

``effrag irrr-data`` makes IRRR's training steps the same way (resumable, one output for all inputs):
dynamic-oracle queries, retrieved candidates and reader targets (:mod:`.irrr_steps`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.cli_args import add_bf16_arg, add_encoder_arg, output_dir, positive_int
from effrag.state_files import read_json, write_json_atomic


def add_synthesize_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("synthesize", help="synthesize Labeler/Filter training data (resumable)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE",
                   help="dataset files or saved Hugging Face datasets (HotpotQA / 2WikiMQA / MuSiQue; "
                        "docs/datasets.md); pooled into one output")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="output directory (resumed if it exists)")
    p.add_argument("--source", choices=["annotation", "llm"], default="annotation",
                   help="records from the datasets' annotations (default) or from an LLM (paper §3.2)")
    p.add_argument("--llm", metavar="SPEC", help="LLM for --source llm: 'default', 'gguf:PATH' or 'openai:URL#MODEL'")
    p.add_argument("--retriever", choices=["bm25", "dense", "hybrid"], default="bm25",
                   help="foundation retriever for hard negatives (default bm25)")
    p.add_argument("--corpus-from", nargs="+", metavar="FILE",
                   help="files whose contexts form the negatives' corpus (default: the inputs)")
    add_encoder_arg(p)
    p.add_argument("--cache-dir", type=Path, help="dense index cache (default: rebuild in memory)")
    add_bf16_arg(p)
    p.add_argument("--no-negatives", dest="negatives", action="store_false", help="skip hard negatives")
    p.add_argument("--neg-k", type=positive_int, default=10, help="hits searched per query for a negative")
    p.add_argument("--neg-per-query", type=positive_int, default=1, help="hard negatives per query (paper: 1)")
    p.add_argument("--skip-answer-negatives", action="store_true",
                   help="pass over a mined hit that states the question's answer (it may be another support for it)")
    p.add_argument("--context-negatives", type=int, default=0, metavar="N",
                   help="also up to N of each question's own distractor paragraphs as negatives under the "
                        "question, hardest first (default 0: none; works with --no-negatives too)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N questions of each input")
    p.add_argument("--batch-size", type=positive_int, help="questions per negatives search (default 64; llm 1)")
    p.add_argument("--format", dest="output_format", choices=["jsonl", "arrow", "both"], default="jsonl",
                   help="jsonl record files (default), a Hugging Face DatasetDict in DIR/dataset (arrow; needs "
                        "the datasets package), or both; every format resumes")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    p.set_defaults(func=run_synthesize)
    return p


def run_synthesize(args) -> dict:
    """Handler of ``effrag synthesize``; ValueError / FileNotFoundError are user errors."""
    from .pipeline import synthesize

    for f in [*args.inputs, *(args.corpus_from or [])]:
        if not Path(f).exists():
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
                        encoder_path=args.encoder, bf16=args.bf16, show_progress=not args.quiet,
                        output_format=args.output_format, context_negatives=args.context_negatives,
                        skip_answer_negatives=args.skip_answer_negatives)
    if args.quiet:
        print(json.dumps(result))
    return result


def add_irrr_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("irrr-data", help="build IRRR training data with the dynamic oracle (resumable)",
                              description="``effrag irrr-data``: build IRRR training steps from dataset files.")
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE",
                   help="training files (HotpotQA / 2WikiMQA / MuSiQue, original or Hugging Face layouts); pooled into one output")
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
    """Handler of ``effrag irrr-data``; ValueError / FileNotFoundError are user errors."""
    from effrag.data import load_questions
    from effrag.setup import RunSetup, check_same_run

    from .irrr_steps import build_irrr_data

    for f in [*args.inputs, *(args.corpus_from or [])]:
        if not Path(f).exists():
            raise FileNotFoundError(f"input file not found: {f}")
    if not 0.0 <= args.augment_p <= 1.0:
        raise ValueError(f"--augment-p must be in [0, 1], got {args.augment_p}")
    if args.candidates < 1:
        raise ValueError(f"--candidates must be positive, got {args.candidates}")
    questions = [q for f in args.inputs for q in load_questions(f, limit=args.limit)]
    setup = RunSetup.build(corpus_from=args.corpus_from or args.inputs, retriever="bm25", cache=False,
                           bm25_article=args.article_bm25, retriever_options={"show_progress": not args.quiet})
    out = Path(args.output)
    # the files' own keys as they were always written, then the run identity (older files lack it: still resume)
    config = {"inputs": args.inputs, "corpus_from": args.corpus_from or args.inputs, "candidates": args.candidates,
              "augment_p": args.augment_p, "limit": args.limit, "seed": args.seed,
              "corpus_fingerprint": setup.corpus.fingerprint(), "bm25": setup.retriever.opts}
    config = {**setup.identity(), **config}
    recorded = out / "build_config.json"
    check_same_run(read_json(recorded) if recorded.is_file() else None, config, out,
                   what="IRRR training steps", may_change=["limit"],
                   hint="use a new --output directory or the same settings")
    stats = build_irrr_data(questions, setup.corpus, setup.retriever, out, candidates=args.candidates,
                            augment_p=args.augment_p, seed=args.seed, progress=not args.quiet)
    write_json_atomic(recorded, config, indent=2)
    if not args.quiet:
        print(json.dumps(stats, indent=2))
    return stats


def add_filter_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("filter-data", help="Filter training records on a trained Labeler's own kept words",
                              description="``effrag filter-data``: exposure augmentation of the Filter's training "
                                          "data (data_synthesis/filter_exposure.py).")
    p.add_argument("--synth", required=True, metavar="DIR", help="`effrag synthesize` output (labeler/filter.jsonl)")
    p.add_argument("--labeler", required=True, metavar="DIR", help="the trained Labeler checkpoint")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="writes DIR/filter.jsonl (the original records, then the new ones) and DIR/filter_data.json")
    p.add_argument("--token-threshold", type=float, default=0.2,
                   help="keep probability of a chunk word, as the loop's token_threshold (default 0.2)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_filter_data)
    return p


def run_filter_data(args) -> dict:
    """Handler of ``effrag filter-data``; a finished output with the same settings is reused."""
    from effrag.models import load_model
    from effrag.setup import same_run

    from .filter_exposure import write_exposed_filter_data

    if not 0.0 < args.token_threshold < 1.0:
        raise ValueError(f"--token-threshold must be in (0, 1), got {args.token_threshold}")
    for name in ("labeler.jsonl", "filter.jsonl"):
        if not (Path(args.synth) / name).is_file():
            raise FileNotFoundError(f"{Path(args.synth) / name} not found (an `effrag synthesize` output folder is needed)")
    done = Path(args.output) / "filter_data.json"
    settings = {"synth": str(args.synth), "labeler": str(args.labeler), "token_threshold": args.token_threshold}
    if done.is_file() and (Path(args.output) / "filter.jsonl").is_file():
        info = read_json(done, "remove it to make this output again")
        if same_run({k: info.get(k) for k in settings}, settings):
            if not args.quiet:
                print(f"{args.output}: done ({info['exposed_records']} new records), reused")
            return info
    labeler = load_model(args.labeler).eval()
    info = write_exposed_filter_data(args.synth, labeler, args.output, args.token_threshold,
                                     batch_size=args.batch_size, show_progress=not args.quiet,
                                     provenance={"labeler": str(args.labeler)})
    if not args.quiet:
        print(json.dumps(info, indent=2))
    return info


def add_ranker_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ranker-data", help="training groups for the pool ranker: each gold chunk against "
                              "the hard negatives of its query", description="``effrag ranker-data`` "
                              "(data_synthesis/ranker_groups.py).")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--synth", metavar="DIR", help="`effrag synthesize` output (labeler.jsonl): each gold chunk "
                        "of its records against hard negatives of the same query")
    source.add_argument("--from-loop", metavar="SYSTEM", help="a trained system (folder or shipped name): its loop "
                        "runs over the --inputs questions and each search is a group, the query with its top --depth "
                        "hits, gold flagged (data_synthesis/loop_groups.py; what a distilled ranker reads at "
                        "inference); a killed run resumes")
    p.add_argument("--loop-config", metavar="FILE", help="with --from-loop: the loop config (default: the system's "
                   "loop.json)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="with --from-loop: questions per loop run")
    p.add_argument("--inputs", required=True, nargs="+", metavar="FILE",
                   help="the dataset files that output was synthesised from (questions, contexts, corpus)")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="writes DIR/ranker.jsonl and DIR/ranker_data.json")
    p.add_argument("--retriever", choices=["dense", "bm25", "hybrid"], default="hybrid",
                   help="what mines the negatives (default hybrid: the loop's default retriever)")
    p.add_argument("--depth", type=positive_int, default=30, help="hits per query to draw negatives from (with "
                   "--from-loop: the hits of a search that make its group)")
    p.add_argument("--negatives", type=positive_int, default=7, help="negatives per group")
    p.add_argument("--groups-per-positive", type=positive_int, default=2)
    p.add_argument("--no-context", action="store_true", help="no distractor paragraphs of the question's own")
    p.add_argument("--question-first-hop-only", action="store_true",
                   help="under the question, only first-hop gold chunks are positives (the loop reads a later hop's "
                        "gold again under the next query)")
    p.add_argument("--info", action="store_true", help="a next query's groups also under its Filter input "
                   "(\"<query> Info: <kept words>\", what the loop's ranker reads with rank_query: info)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=None, help="index cache (default: effrag's)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run_ranker_data)
    return p


def run_ranker_data(args) -> dict:
    """Handler of ``effrag ranker-data``; a finished output with the same settings is reused."""
    from effrag.setup import same_run

    from .ranker_groups import write_ranker_data

    if args.from_loop:
        return run_loop_groups(args)
    if args.loop_config:
        raise ValueError("ranker-data: --loop-config goes with --from-loop SYSTEM")
    options = {"depth": args.depth, "negatives": args.negatives, "groups_per_positive": args.groups_per_positive,
               "context": not args.no_context, "seed": args.seed, "info": args.info,
               "question_first_hop_only": args.question_first_hop_only}
    done = Path(args.output) / "ranker_data.json"
    settings = {"synth": str(args.synth), "inputs": [str(f) for f in args.inputs], "retriever": args.retriever,
                **options}
    if done.is_file() and (Path(args.output) / "ranker.jsonl").is_file():
        info = read_json(done, "remove it to make this output again")
        if same_run({k: info.get(k) for k in settings}, settings):
            if not args.quiet:
                print(f"{args.output}: done ({info['groups']} groups), reused")
            return info
    info = write_ranker_data(args.synth, args.inputs, args.output, args.retriever, cache_dir=args.cache_dir,
                             **options)
    if not args.quiet:
        print(json.dumps(info, indent=2))
    return info


def run_loop_groups(args) -> dict:
    """``effrag ranker-data --from-loop``: a finished output with the same settings is reused, a partial one
    resumes (:func:`.loop_groups.write_loop_groups`)."""
    from effrag.setup import same_run

    from .loop_groups import loop_group_settings, write_loop_groups

    done = Path(args.output) / "ranker_data.json"
    if done.is_file() and (Path(args.output) / "ranker.jsonl").is_file():
        info = read_json(done, "remove it to make this output again")
        settings = loop_group_settings(args.from_loop, args.inputs, loop_config=args.loop_config,
                                       retriever=args.retriever, depth=args.depth)
        if same_run({k: info.get(k) for k in settings}, settings):
            if not args.quiet:
                print(f"{args.output}: done ({info['groups']} groups), reused")
            return info
    info = write_loop_groups(args.from_loop, args.inputs, args.output, loop_config=args.loop_config,
                             retriever=args.retriever, depth=args.depth, batch_size=args.batch_size,
                             cache_dir=args.cache_dir, show_progress=not args.quiet)
    if not args.quiet:
        print(json.dumps(info, indent=2))
    return info


def add_ranker_teacher_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ranker-teacher", help="a trained ranker's score of every candidate of ranker groups "
                              "(soft targets to distill a smaller ranker)", description="``effrag ranker-teacher`` "
                              "(data_synthesis/teacher_scores.py); a killed run resumes.")
    p.add_argument("--data", required=True, metavar="DIR|FILE", help="`effrag ranker-data` output (DIR/ranker.jsonl)")
    p.add_argument("--teacher", required=True, metavar="DIR", help="the trained ranker (a checkpoint folder)")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="writes DIR/ranker.jsonl (each candidate with 'teacher') and DIR/ranker_teacher.json")
    p.add_argument("--max-length", type=positive_int, default=None, help="default: the teacher's own")
    p.add_argument("--batch-size", type=positive_int, default=64)
    add_bf16_arg(p, help="bf16 autocast for the teacher (where the CPU runs it natively)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run_ranker_teacher)
    return p


def run_ranker_teacher(args) -> dict:
    """Handler of ``effrag ranker-teacher``; a finished output with the same settings is reused."""
    from effrag.models.model_files import fingerprint

    from .teacher_scores import DONE_NAME, write_teacher_scores

    done = Path(args.output) / DONE_NAME
    if done.is_file() and (Path(args.output) / "ranker.jsonl").is_file():
        info = read_json(done, "remove it to make this output again")
        src = Path(args.data) / "ranker.jsonl" if Path(args.data).is_dir() else Path(args.data)
        same = (info.get("data") == str(args.data) and src.is_file() and info.get("data_bytes") == src.stat().st_size
                and info.get("teacher_fingerprint") == fingerprint(args.teacher) and info.get("bf16") == args.bf16
                and (args.max_length is None or info.get("max_length") == args.max_length))
        if same:
            if not args.quiet:
                print(f"{args.output}: done ({info['groups']} groups), reused")
            return info
    info = write_teacher_scores(args.data, args.teacher, args.output, max_length=args.max_length,
                                batch_size=args.batch_size, bf16=args.bf16, show_progress=not args.quiet)
    if not args.quiet:
        print(json.dumps({k: v for k, v in info.items() if k != "ranker_data"}, indent=2))
    return info


COMMANDS = (add_synthesize_parser, add_irrr_data_parser, add_filter_data_parser, add_ranker_data_parser,
            add_ranker_teacher_parser)


def main(argv: list[str] | None = None) -> int:
    """``python -m data_synthesis.cli ...`` is ``effrag synthesize ...`` (same parser, errors and exit codes; also
    where the ``effrag.commands`` entry points are not installed)."""
    from effrag.cli import main as effrag_main

    argv = list(sys.argv[1:] if argv is None else argv)
    named = argv[:1] and argv[0] in ("synthesize", "irrr-data", "filter-data", "ranker-data", "ranker-teacher")
    return effrag_main(argv if named else ["synthesize", *argv], commands=COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
