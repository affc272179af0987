"""The ``effrag`` command line.

Each subcommand is an ``add_<name>_parser(subparsers)`` function that adds its
parser and sets ``func`` to its handler. :data:`SUBCOMMANDS` lists them as
``"module:function"`` and is resolved lazily, so a subcommand living in another
module (``synthesize``, ``quickstart``, ``serve``) is added with one line here and
its heavy imports are paid only when it runs. ``eval --method NAME`` also gets
the options that method declares in ``Pipeline.add_args``.

User errors (missing files, bad data, empty corpora, mismatched indexes, bad
values) end with a one-line ``effrag: error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see effrag.retrieval.encoder: must precede torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SUBCOMMANDS: list[str] = [
    "effrag.cli:add_corpus_parser",
    "effrag.cli:add_index_parser",
    "effrag.cli:add_eval_parser",
    "data_synthesis.cli:add_synthesize_parser",
    "effrag.quickstart:add_quickstart_parser",
    "effrag.serve:add_serve_parser",
    "effrag.irrr.cli:add_irrr_data_parser",
]
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _default_cache() -> Path:
    return Path(os.environ.get("EFFRAG_CACHE_DIR", Path.home() / ".cache" / "effrag" / "indexes"))


# ---------------------------------------------------------------------------- corpus
def add_corpus_parser(sub) -> None:
    p = sub.add_parser("corpus", help="build a retrieval corpus")
    csub = p.add_subparsers(dest="corpus_cmd", required=True, metavar="{build}")
    b = csub.add_parser("build", help="pool the context passages of dataset files into corpus.jsonl")
    b.add_argument("--inputs", nargs="+", required=True, metavar="FILE", help="dataset files, any supported format")
    b.add_argument("--dataset", help="force the input format instead of detecting it")
    b.add_argument("--output", required=True, metavar="corpus.jsonl")
    b.set_defaults(func=_cmd_corpus_build)


def _cmd_corpus_build(args) -> None:
    from effrag.data import build_corpus

    corpus = build_corpus(args.inputs, args.dataset)
    corpus.save(args.output)
    print(f"wrote {len(corpus)} passages from {len(args.inputs)} file(s) to {args.output}")


# ---------------------------------------------------------------------------- index
def _add_retriever_args(p, required: bool) -> None:
    p.add_argument("--retriever", choices=["dense", "bm25", "hybrid"], required=required)
    p.add_argument("--encoder", metavar="PATH", help="local HF encoder folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--index-type", choices=["flat", "ivf", "hnsw"], default="flat", help="FAISS index (dense)")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for encoding (~3x faster on GPUs and AMX/AVX512-BF16 CPUs; fp32 on other CPUs, where emulated bf16 is slower: effrag.hardware)")
    p.add_argument("--bm25-article", action="store_true",
                   help="BM25 plus IRRR's article score (IDF^2, b=0 over each title's paragraphs; Appendix B)")


def add_index_parser(sub) -> None:
    p = sub.add_parser("index", help="build a retrieval index")
    isub = p.add_subparsers(dest="index_cmd", required=True, metavar="{build}")
    b = isub.add_parser("build", help="index a corpus.jsonl into DIR (resumes an interrupted dense build)")
    b.add_argument("--corpus", required=True, metavar="corpus.jsonl")
    _add_retriever_args(b, required=True)
    b.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    b.set_defaults(func=_cmd_index_build)


def _retriever_opts(args) -> dict:
    opts = {"index_type": args.index_type} if args.retriever != "bm25" else {}
    if getattr(args, "bm25_article", False):
        if args.retriever == "dense":
            raise ValueError("--bm25-article needs --retriever bm25 or hybrid")
        opts["article"] = True
    return opts


def _cmd_index_build(args) -> None:
    import shutil

    from effrag.data import Corpus
    from effrag.retrieval import build_retriever

    corpus = Corpus.from_jsonl(args.corpus)
    out = Path(args.output)
    opts = _retriever_opts(args)
    if args.retriever != "bm25":
        opts["cache_dir"] = out / "emb_shards"
    retriever = build_retriever(args.retriever, corpus, encoder_path=args.encoder, bf16=args.bf16, **opts)
    retriever.save(out)
    shutil.rmtree(out / "emb_shards", ignore_errors=True)
    print(f"wrote {args.retriever} index of {len(corpus)} passages to {out}")


# ---------------------------------------------------------------------------- eval
def add_eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a method on a dataset file")
    p.add_argument("--method", default="direct-r", help="registered method (default direct-r)")
    p.add_argument("--questions", required=True, metavar="FILE", help="dataset file in its original format")
    p.add_argument("--dataset", help="force the questions' format instead of detecting it")
    p.add_argument("--corpus-from", nargs="+", default=[], metavar="FILE",
                   help="pool the corpus from these files' contexts plus the questions' own (index cached)")
    p.add_argument("--corpus", metavar="corpus.jsonl", help="corpus file (indexed and cached unless --index)")
    p.add_argument("--index", metavar="DIR", help="a saved index (from `effrag index build`)")
    _add_retriever_args(p, required=False)
    p.add_argument("--k", type=positive_int, action="append", metavar="K",
                   help="passages to retrieve; repeat for several (default 10)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N questions")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="questions per pipeline call (latency is per question either way)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm", default=None, metavar="SPEC",
                   help="LLM for answers: 'default' (bundled SmolLM2), gguf:PATH or openai:URL#model; "
                        "retrieval-only methods then also answer with the paper's retrieval prompt")
    p.add_argument("--cache-dir", type=Path, default=None, help=f"index cache (default {_default_cache()})")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    p.add_argument("--overwrite", action="store_true", help="discard earlier predictions in --output")
    p.set_defaults(func=_cmd_eval, method_opts=[])


def _eval_retriever(args, questions_path: Path):
    """(retriever, corpus, description) from --index, --corpus or --corpus-from."""
    from effrag.data import Corpus, build_corpus
    from effrag.retrieval import cached_retriever, load_retriever
    from effrag.retrieval.meta import read_meta

    if args.index:
        kind = read_meta(args.index)["kind"]
        if args.retriever and args.retriever != kind:
            raise ValueError(f"--retriever {args.retriever} but {args.index} holds a {kind} index")
        corpus = Corpus.from_jsonl(args.corpus) if args.corpus else None
        retriever = load_retriever(args.index, corpus=corpus, encoder_path=args.encoder, bf16=args.bf16)
        return retriever, retriever.corpus, kind
    if not args.retriever:
        raise ValueError("--retriever is required unless --index is given")
    if args.corpus and args.corpus_from:
        raise ValueError("give either --corpus or --corpus-from, not both")
    if args.corpus:
        corpus = Corpus.from_jsonl(args.corpus)
    elif args.corpus_from:
        corpus = build_corpus([*args.corpus_from, questions_path], args.dataset)
    else:
        raise ValueError("no corpus: give --corpus-from FILE..., --corpus corpus.jsonl or --index DIR")
    retriever = cached_retriever(args.retriever, corpus, args.cache_dir or _default_cache(),
                                 encoder_path=args.encoder, bf16=args.bf16, **_retriever_opts(args))
    return retriever, corpus, args.retriever


def _encoder_path(retriever) -> str | None:
    for r in [retriever, *getattr(retriever, "retrievers", [])]:
        if getattr(r, "encoder", None) is not None:
            return str(r.encoder.path)
    return None


def _llm_option(cls, spec: str, dataset: str) -> dict:
    """``--llm`` for a method: LLM methods take the spec, retrieval methods a shared answer generator."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if "llm" in params:
        return {"llm": spec}
    if "generator" in params:
        from effrag.pipelines.generation import Generator

        return {"generator": Generator(spec, dataset=dataset)}
    raise ValueError(f"method {cls.name!r} does not use an LLM (--llm)")


def _cmd_eval(args) -> None:
    import shutil

    from effrag.data import load_questions, map_gold
    from effrag.evaluation import evaluate, markdown_table
    from effrag.pipelines import build_pipeline, get_pipeline_class

    cls = get_pipeline_class(args.method)
    ks = sorted(set(args.k or [10]))
    if len(ks) > 1 and not getattr(cls, "slice_k", False):
        raise ValueError(f"method {args.method!r} takes one --k")
    qpath = Path(args.questions)
    questions = load_questions(qpath, args.dataset, limit=args.limit)
    if not questions:
        raise ValueError(f"{qpath}: no questions")
    retriever, corpus, kind = _eval_retriever(args, qpath)
    gold, rep = map_gold(questions, corpus, report=True)
    if rep.missing:
        print(f"effrag: warning: {len(rep.missing)} of {rep.total} gold passages are not in the corpus "
              "(counted as not retrieved)", file=sys.stderr)
        gold = rep.counted_as_missed(questions, gold)
    method_opts = {d: getattr(args, d) for d in args.method_opts}
    llm_opts = {}
    import inspect

    if "dataset" in inspect.signature(cls.__init__).parameters and "dataset" not in method_opts:
        llm_opts["dataset"] = questions[0].dataset  # few-shot prompts per dataset
    if args.llm is not None and "llm" not in method_opts:
        llm_opts.update(_llm_option(cls, args.llm, questions[0].dataset))
    # a method whose depth lives in its own config (EfficientRAG's hop_k in --er-config) keeps it unless --k is given
    k = max(ks) if args.k or not getattr(cls, "k_in_config", False) else None
    pipeline = build_pipeline(args.method, retriever, k=k, **method_opts, **llm_opts)
    out = Path(args.output)
    if args.overwrite and out.exists():
        shutil.rmtree(out)
    config = {"method": pipeline.name, "dataset": questions[0].dataset, "questions": str(qpath.resolve()),
              "corpus_from": [str(Path(f).resolve()) for f in args.corpus_from],
              "corpus": args.corpus, "index": args.index, "retriever": kind,
              "corpus_fingerprint": corpus.fingerprint(), "corpus_size": len(corpus),
              "index_type": args.index_type if kind != "bm25" else None,
              "encoder": _encoder_path(retriever),
              "bf16": args.bf16, "k": ks, "limit": args.limit, "batch_size": args.batch_size,
              "method_options": method_opts, "llm": args.llm,
              **({"method_config": pipeline.config.to_json()} if hasattr(getattr(pipeline, "config", None), "to_json") else {})}
    entries = evaluate(pipeline, questions, gold, out, config, ks=ks, batch_size=args.batch_size, seed=args.seed)
    print(markdown_table(entries), end="")
    try:  # recall against chunks, like the paper's Figure 2 (needs the plots extra)
        from effrag.evaluation.plots import write_report_plot

        write_report_plot([out], out)
    except ImportError:
        pass
    except ValueError as e:  # e.g. a method that retrieved nothing: metrics are written, only the plot is skipped
        print(f"effrag: note: no plot ({e})", file=sys.stderr)
    print(f"wrote {out / 'predictions.jsonl'}, metrics.json, metrics.md")


# ---------------------------------------------------------------------------- main
def _peek(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="effrag", description="Multi-hop retrieval toolkit: EfficientRAG, IRRR and peers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for spec in SUBCOMMANDS:
        module, func = spec.split(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                continue  # that subcommand's module is not installed/written: leave it out
            raise
        getattr(mod, func)(sub)
    argv = argv or []
    if argv[:1] == ["eval"] and "eval" in sub.choices:
        from effrag.pipelines import get_pipeline_class

        method = _peek(argv, "--method") or "direct-r"
        ev = sub.choices["eval"]
        before = {a.dest for a in ev._actions}
        get_pipeline_class(method).add_args(ev)
        ev.set_defaults(method_opts=[a.dest for a in ev._actions if a.dest not in before])
    return parser


def output_dir(value: str) -> str:
    """argparse type of an ``--output`` folder: an existing *file* there is a usage error, before any work."""
    if Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value} is an existing file; give a folder path")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        args.func(args)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
            ValueError) as e:
        print(f"effrag: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as e:  # an optional package the command needs (e.g. the llm extra)
        print(f"effrag: error: missing package: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("effrag: interrupted (rerun the same command to resume)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
