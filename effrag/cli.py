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
    "data_synthesis.cli:add_irrr_data_parser",
]
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


from effrag.experiment import (add_corpus_args, add_questions_args, add_retriever_args,  # noqa: E402
                               output_dir, positive_int)


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
def add_index_parser(sub) -> None:
    p = sub.add_parser("index", help="build or verify a retrieval index")
    isub = p.add_subparsers(dest="index_cmd", required=True, metavar="{build,verify}")
    b = isub.add_parser("build", help="index a corpus.jsonl into DIR (resumes an interrupted dense build)")
    b.add_argument("--corpus", required=True, metavar="corpus.jsonl")
    add_retriever_args(b, required=True)
    b.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    b.set_defaults(func=_cmd_index_build)
    v = isub.add_parser("verify", help="check every file of a saved index against its recorded sha256 (full read)")
    v.add_argument("index", metavar="DIR")
    v.add_argument("--cheap", action="store_true", help="sizes + sampled hashes only (the check done on every load)")
    v.set_defaults(func=_cmd_index_verify)


def _cmd_index_verify(args) -> None:
    from effrag.retrieval.meta import verify_index

    mode = verify_index(args.index, verify="cheap" if args.cheap else "full")
    print(f"{args.index}: " + ("no hashes recorded (saved before integrity checks): not checked" if mode == "off"
                               else f"every file matches its recorded size and sha256 ({mode} check)"))


def _cmd_index_build(args) -> None:
    import shutil

    from effrag.experiment import open_corpus, open_retriever

    corpus = open_corpus(args.corpus)
    out = Path(args.output)
    shards = {"cache_dir": out / "emb_shards"} if args.retriever != "bm25" else {}  # a killed build resumes
    retriever = open_retriever(args.retriever, corpus, cache=False, encoder=args.encoder, bf16=args.bf16,
                               index_type=args.index_type, bm25_article=args.bm25_article, **shards)
    retriever.save(out)
    shutil.rmtree(out / "emb_shards", ignore_errors=True)
    print(f"wrote {args.retriever} index of {len(corpus)} passages to {out}")


# ---------------------------------------------------------------------------- eval
def add_eval_parser(sub) -> None:
    from effrag.data.aliases import add_answer_alias_args

    p = sub.add_parser("eval", help="evaluate a method on a dataset file")
    p.add_argument("--method", default="direct-r", help="registered method (default direct-r)")
    add_questions_args(p)
    add_corpus_args(p)
    add_retriever_args(p)
    p.add_argument("--k", type=positive_int, action="append", metavar="K",
                   help="passages to retrieve; repeat for several (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="questions per pipeline call (latency is per question either way)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm", default=None, metavar="SPEC",
                   help="LLM for answers: 'default' (bundled SmolLM2), gguf:PATH or openai:URL#model; "
                        "retrieval-only methods then also answer with the paper's retrieval prompt")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    p.add_argument("--overwrite", action="store_true", help="discard earlier predictions in --output")
    add_answer_alias_args(p)  # --aliases FILE: 2Wiki v1.1 answer aliases
    p.set_defaults(func=_cmd_eval, method_opts=[])


def _cmd_eval(args) -> None:
    import shutil

    from effrag.data.aliases import apply_aliases
    from effrag.evaluation import evaluate, markdown_table
    from effrag.experiment import RunSetup, method_options
    from effrag.pipelines import build_pipeline, get_pipeline_class, llm_options

    cls = get_pipeline_class(args.method)
    ks = sorted(set(args.k or [10]))
    if len(ks) > 1 and not getattr(cls, "slice_k", False):
        raise ValueError(f"method {args.method!r} takes one --k")
    setup = RunSetup.from_args(args)
    answer_aliases = apply_aliases(args, setup.questions)  # extends 2Wiki answers in place when --aliases is given
    if setup.missing_gold_warning():
        print(f"effrag: warning: {setup.missing_gold_warning()}", file=sys.stderr)
    questions, retriever, kind = setup.questions, setup.retriever, setup.kind
    method_opts = method_options(args)
    # --llm and the questions' dataset (few-shot prompts), as the method declares it uses them
    llm_opts = {key: v for key, v in llm_options(cls, args.llm, questions[0].dataset).items()
                if key not in method_opts}
    # a method whose depth lives in its own config (EfficientRAG's hop_k in --er-config) keeps it unless --k is given
    k = max(ks) if args.k or not getattr(cls, "k_in_config", False) else None
    pipeline = build_pipeline(args.method, retriever, k=k, **method_opts, **llm_opts)
    out = Path(args.output)
    if args.overwrite and out.exists():
        shutil.rmtree(out)
    config = {"method": pipeline.name, **setup.describe(),
              "index_type": args.index_type if kind != "bm25" else None,
              "bf16": args.bf16, "k": ks, "limit": args.limit, "batch_size": args.batch_size,
              "method_options": method_opts, "llm": args.llm, "answer_aliases": answer_aliases,
              **({"method_config": pipeline.config.to_json()} if hasattr(getattr(pipeline, "config", None), "to_json") else {})}
    entries = evaluate(pipeline, questions, setup.gold, out, config, ks=ks, batch_size=args.batch_size, seed=args.seed)
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
        from effrag.experiment import add_method_args

        add_method_args(sub.choices["eval"], _peek(argv, "--method") or "direct-r")
    return parser


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
