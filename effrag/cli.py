"""The ``effrag`` command line.

Each subcommand is an ``add_<name>_parser(subparsers)`` function that adds its
parser and sets ``func`` to its handler. :data:`SUBCOMMANDS` lists effrag's own as
``"module:function"`` and is resolved lazily, so a subcommand living in another
module (``quickstart``, ``serve``) is added with one line here and its heavy imports
are paid only when it runs. Commands of other installed packages come in through the
entry point group ``effrag.commands`` (``name = "module:add_<name>_parser"``): the
training-data commands (``synthesize``, ``irrr-data``, ``filter-data``, ``ranker-data``)
are registered there by the ``data_synthesis`` package (``pyproject.toml``), so effrag
itself imports nothing outside itself. ``eval --method NAME`` also gets the options
that method declares in ``Pipeline.add_args``.

User errors (missing files, bad data, empty corpora, mismatched indexes, bad
values) end with a one-line ``effrag: error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import errno
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
    "effrag.codec_cli:add_codec_parser",
    "effrag.cli:add_eval_parser",
    "effrag.retrieve_cli:add_retrieve_parser",
    "effrag.quickstart:add_quickstart_parser",
    "effrag.serve:add_serve_parser",
]
COMMAND_GROUP = "effrag.commands"  # entry points of other packages' subcommands
# the training-data commands the project's data_synthesis package registers in COMMAND_GROUP: named here only
# to say how to get them when they are missing
DATA_COMMANDS = ("synthesize", "irrr-data", "filter-data", "ranker-data", "ranker-teacher")
EXIT_USAGE = 2


from effrag.cli_args import (  # noqa: E402
    add_bf16_arg,
    add_corpus_args,
    add_encoder_arg,
    add_questions_args,
    add_retriever_args,
    output_dir,
    positive_int,
)
from effrag.pipelines.base import DEFAULT_METHOD  # noqa: E402  (the one default method of every front end)


class _Formatter(argparse.HelpFormatter):
    """An option without a metavar shows what it takes (N, X, PATH, NAME) instead of its own name a second time:
    ``eval --method efficientrag``'s usage line read ``--tag-threshold TAG_THRESHOLD`` for each of its options."""

    def _get_default_metavar_for_optional(self, action) -> str:
        if action.type in (int, positive_int):
            return "N"
        if action.type is float:
            return "X"
        if action.type in (Path, output_dir):
            return "PATH"
        return "NAME"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)  # every subcommand's parser is a _Parser
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------- corpus
def add_corpus_parser(sub) -> None:
    p = sub.add_parser("corpus", help="build a retrieval corpus")
    csub = p.add_subparsers(dest="corpus_cmd", required=True, metavar="{build}")
    b = csub.add_parser("build", help="pool passages (dataset contexts, your own documents) into corpus.jsonl")
    b.add_argument("--inputs", nargs="+", required=True, metavar="FILE|DIR",
                   help="dataset files (any supported format), JSONL files of {title?, text} passages (no id needed: "
                        "ids are content hashes), or folders of .txt/.md files (split at blank lines)")
    b.add_argument("--dataset", help="force the dataset files' format instead of detecting it")
    _add_max_words_arg(b)
    b.add_argument("--output", required=True, metavar="corpus.jsonl")
    b.set_defaults(func=_cmd_corpus_build)


def _add_max_words_arg(p) -> None:
    from effrag.data.documents import DEFAULT_MAX_WORDS

    p.add_argument("--max-words", type=positive_int, default=DEFAULT_MAX_WORDS, metavar="N",
                   help="a folder of text files: merge short paragraphs and split long ones into passages of at "
                        f"most N words (default {DEFAULT_MAX_WORDS})")


def _cmd_corpus_build(args) -> None:
    from effrag.data.documents import corpus_from_inputs

    corpus = corpus_from_inputs(args.inputs, args.dataset, args.max_words)
    corpus.save(args.output)
    print(f"wrote {len(corpus)} passages from {len(args.inputs)} file(s) to {args.output}")


# ---------------------------------------------------------------------------- index
def add_index_parser(sub) -> None:
    p = sub.add_parser("index", help="build or verify a retrieval index")
    isub = p.add_subparsers(dest="index_cmd", required=True, metavar="{build,encode,vectors,verify}")
    b = isub.add_parser("build", help="index a corpus.jsonl or a folder of text files into DIR (resumes an "
                                      "interrupted dense build)")
    b.add_argument("--corpus", required=True, metavar="corpus.jsonl|DIR",
                   help="passages {id?, title?, text} (JSONL), or a folder of .txt/.md files")
    _add_max_words_arg(b)
    add_retriever_args(b, required=True)
    b.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    b.add_argument("--overwrite", action="store_true",
                   help="replace the index already in DIR (its files are removed first; other files stay)")
    b.add_argument("--system", metavar="NAME|DIR",
                   help="also build this EfficientRAG system's late-interaction chunk vectors into DIR/late-vectors "
                        "(e.g. efficientrag-all): opened over this index, it reads them on demand at any corpus size "
                        "(docs/scale.md); resumable with `effrag index vectors`")
    s = b.add_argument_group("scale (docs/scale.md)")
    s.add_argument("--backend", choices=["faiss", "milvus"], default="faiss",
                   help="where dense vectors live: a FAISS file in DIR (default) or a Milvus collection")
    s.add_argument("--milvus-uri", metavar="URI",
                   help="Milvus server (http://host:19530) or Milvus Lite file (default DIR/milvus.db)")
    s.add_argument("--collection", default="effrag", help="Milvus collection name (default effrag)")
    s.add_argument("--nlist", type=positive_int, help="IVF lists (default 4 sqrt(n))")
    s.add_argument("--nprobe", type=positive_int, help="IVF lists searched (default 16; saved, used when loading)")
    s.add_argument("--ef-search", type=positive_int, help="HNSW search breadth (default 128)")
    s.add_argument("--pq-m", type=positive_int, help="IVF-PQ bytes per vector (default dim/8)")
    s.add_argument("--train-size", type=positive_int, help="vectors sampled to train IVF/PQ (default 64 per list)")
    _add_encode_args(s)
    b.set_defaults(func=_cmd_index_build)
    e = isub.add_parser("encode", help="encode a corpus into DIR/emb_shards, resumably and data-parallel "
                                       "(accelerate launch / torchrun -m effrag.cli index encode ...)")
    e.add_argument("--corpus", required=True, metavar="corpus.jsonl|DIR")
    _add_max_words_arg(e)
    add_encoder_arg(e)
    add_bf16_arg(e)
    e.add_argument("--output", required=True, metavar="DIR", type=output_dir,
                   help="the index folder `effrag index build --output DIR` will read the shards from")
    _add_encode_args(e)
    e.set_defaults(func=_cmd_index_encode)
    vec = isub.add_parser("vectors", help="build (or finish, after a kill) a system's late-interaction chunk vectors "
                                          "beside a saved index, resumably and data-parallel (torchrun -m effrag.cli "
                                          "index vectors ...)")
    vec.add_argument("--index", required=True, metavar="DIR", help="an index folder (effrag index build --output)")
    vec.add_argument("--system", required=True, metavar="NAME|DIR", help="an EfficientRAG system (efficientrag-all)")
    vec.set_defaults(func=_cmd_index_vectors)
    v = isub.add_parser("verify", help="check every file of a saved index against its recorded sha256 (full read)")
    v.add_argument("index", metavar="DIR")
    v.add_argument("--cheap", action="store_true", help="sizes + sampled hashes only (the check done on every load)")
    v.add_argument("--record", action="store_true",
                   help="an index without file hashes (older, or removed from index_meta.json): record them now "
                        "(only for an index you trust: its present files become the reference)")
    v.set_defaults(func=_cmd_index_verify)


def _cmd_index_verify(args) -> None:
    from effrag.retrieval.meta import read_meta, record_index, verify_index

    meta = read_meta(args.index)
    if meta.get("files") is None:
        if args.record:
            n = record_index(args.index)
            print(f"{args.index}: recorded the size and sha256 of {n} files in index_meta.json; "
                  "every load checks them from now on")
        else:
            print(f"{args.index}: no hashes recorded (saved before integrity checks, or removed from index_meta.json): "
                  "not checked; --record records them")
        return
    mode = verify_index(args.index, meta, verify="cheap" if args.cheap else "full")
    print(f"{args.index}: every file matches its recorded size and sha256 ({mode} check)")


def _add_encode_args(g) -> None:
    g.add_argument("--shard-size", type=positive_int, default=1024,
                   help="passages per embedding shard, the unit of resuming and of data parallelism (default 1024)")
    g.add_argument("--batch-size", type=positive_int, default=64, help="encoder batch size (default 64)")


def _scale_options(args) -> dict:
    """The ``index build`` options of docs/scale.md that were given, as retriever options."""
    names = {"nlist": "nlist", "nprobe": "nprobe", "ef_search": "ef_search", "pq_m": "pq_m",
             "train_size": "train_size", "batch_size": "batch_size"}
    opts = {key: getattr(args, a) for a, key in names.items() if getattr(args, a, None) is not None}
    if args.backend == "milvus":
        opts.pop("pq_m", None), opts.pop("train_size", None)
        opts.update(uri=args.milvus_uri or str(Path(args.output) / "milvus.db"), collection=args.collection)
    elif args.retriever == "bm25":
        return {}
    return {**opts, "shard_size": args.shard_size}


def _cmd_index_encode(args) -> None:
    from effrag.retrieval import Encoder, encode_shards, init_distributed
    from effrag.setup import open_corpus

    rank, world = init_distributed()
    corpus = open_corpus(args.corpus, max_words=args.max_words)
    store = Path(args.output) / "emb_shards"
    stats = encode_shards(Encoder(args.encoder, bf16=args.bf16), corpus.passages, store,
                          shard_size=args.shard_size, batch_size=args.batch_size,
                          corpus_fingerprint=corpus.fingerprint(), rank=rank, world_size=world)
    print(f"rank {rank}/{world}: encoded {len(stats['encoded'])}, kept {len(stats['reused'])} finished "
          f"of {stats['n_shards']} shards in {store}")


def _cmd_index_build(args) -> None:
    import shutil

    from effrag.retrieval import build_retriever
    from effrag.retrieval.meta import META, remove_index
    from effrag.setup import open_corpus, retriever_options

    if args.backend == "milvus" and args.retriever != "dense":
        raise ValueError("--backend milvus holds a dense index: use --retriever dense")
    out = Path(args.output)
    if (out / META).is_file():  # before the corpus is read: refuse at once
        if not args.overwrite:
            raise FileExistsError(f"{out} already holds an index ({META}); --overwrite replaces it, "
                                  "or choose another --output")
        remove_index(out)
    corpus = open_corpus(args.corpus, max_words=args.max_words)
    kind = "milvus" if args.backend == "milvus" else args.retriever
    # a killed build resumes from its shards: the dense encoder's store is the retriever's cache_dir option (not
    # open_retriever's cache_dir, the index cache, which a build into --output does not use)
    shards = {"cache_dir": out / "emb_shards"} if kind != "bm25" else {}
    opts = {**retriever_options(kind, args.index_type, args.bm25_article), **shards, **_scale_options(args)}
    retriever = build_retriever(kind, corpus, encoder_path=args.encoder, bf16=args.bf16, **opts)
    retriever.save(out)
    shutil.rmtree(out / "emb_shards", ignore_errors=True)
    print(f"wrote {kind} index of {len(corpus)} passages to {out}")
    if args.system:
        _build_vectors(args.system, retriever, corpus.passages, out)


def _build_vectors(system: str, retriever, passages, out: Path) -> None:
    from effrag.models.late_vectors import VECTORS_DIR
    from effrag.pipelines.efficientrag.vectors import build_system_vectors
    from effrag.retrieval import init_distributed

    rank, world = init_distributed()
    print(f"building the late-interaction chunk vectors of {system} into {out / VECTORS_DIR} (a kill keeps the "
          f"finished parts: `effrag index vectors --index {out} --system {system}` finishes them)", file=sys.stderr)
    stats = build_system_vectors(system, retriever, passages, out / VECTORS_DIR, rank=rank, world=world)
    print(f"rank {rank}/{world}: {stats['encoded']} chunks encoded, {stats['found']} already stored, "
          f"{len(stats['variants'])} variant(s), {stats['seconds']:.1f} s")


def _cmd_index_vectors(args) -> None:
    from effrag.setup import open_index

    retriever = open_index(args.index)
    _build_vectors(args.system, retriever, retriever.corpus.passages if hasattr(retriever.corpus, "passages")
                   else list(retriever.corpus), Path(args.index))


# ---------------------------------------------------------------------------- eval
def add_eval_parser(sub) -> None:
    from effrag.data.aliases import add_answer_alias_args

    p = sub.add_parser("eval", help="evaluate a method on a dataset file")
    p.add_argument("--config", metavar="FILE",
                   help="a run config (YAML/JSON; effrag/configs/eval.yaml) or a run's config.json to replay: "
                        "its values are the defaults, flags override them (effrag.run_config)")
    p.add_argument("--method", default=DEFAULT_METHOD,
                   help=f"registered method (default {DEFAULT_METHOD}: the shipped system; direct-r: the retriever alone)")
    add_questions_args(p)
    add_corpus_args(p)
    add_retriever_args(p)
    p.add_argument("--k", type=positive_int, action="append", metavar="K",
                   help="passages to retrieve; repeat for several (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="questions per pipeline call (latency is per question either way)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm", default=None, metavar="SPEC",
                   help="LLM for answers: 'default' (bundled SmolLM2), gguf:PATH, hf:default|PATH[#PRECISION] or openai:URL#model; "
                        "retrieval-only methods then also answer with the paper's retrieval prompt")
    g = p.add_argument_group("extractive reader (answers without an LLM)")
    g.add_argument("--reader", default=None, metavar="DIR|NAME",
                   help="trained reader checkpoint folder or a shipped reader's name (reader-all): retrieval methods "
                        "answer their pool with it; SearChain verifies with it (default reader-all)")
    g.add_argument("--reader-mode", choices=("together", "each"), default="together",
                   help="read the ranked chunks packed into windows (default) or each chunk alone")
    g.add_argument("--reader-context", choices=("chunks", "kept_words"), default="chunks",
                   help="whole chunks, or only the words EfficientRAG's Labeler kept (its compression)")
    p.add_argument("--output", required=True, metavar="DIR", type=output_dir)
    p.add_argument("--overwrite", action="store_true", help="discard earlier predictions in --output")
    add_answer_alias_args(p)  # --aliases FILE: 2Wiki v1.1 answer aliases
    p.set_defaults(func=_cmd_eval, method_opts=[])


def _cmd_eval(args) -> None:
    import shutil

    from effrag import run_config
    from effrag.cli_args import method_options
    from effrag.data.aliases import apply_aliases
    from effrag.evaluation import evaluate, markdown_table
    from effrag.pipelines import get_pipeline_class, llm_options, reader_options
    from effrag.pretrained import resolve_model
    from effrag.setup import RunSetup
    from effrag.tuning import model_fingerprint

    run_config.finish(args)  # --config's --k, unless given here
    cls = get_pipeline_class(args.method)
    ks = sorted(set(args.k or [10]))
    if len(ks) > 1 and not getattr(cls, "slice_k", False):
        raise ValueError(f"method {args.method!r} takes one --k")
    if args.reader and args.llm and cls.uses_generator:
        raise ValueError("give --llm or --reader for the answers, not both")
    # the reader loads before the corpus and index, so a bad checkpoint fails at once
    reader_opts = reader_options(cls, args.reader, args.reader_mode == "together", args.reader_context)
    method_opts = method_options(args)
    # the method resolved once (a bad loop option fails before the index is built); a method whose depth lives in
    # its own config (EfficientRAG's hop_k in --er-config) keeps it unless --k is given
    depth = dict(k=max(ks) if args.k else None, default_k=max(ks))
    plan = cls.plan(method_opts, dataset=args.dataset, **depth)
    if args.retriever is None and args.index is None:  # e.g. the retriever EfficientRAG's loop config was tuned for
        args.retriever = plan.retriever
    if args.encoder is None and args.index is None:  # and the encoder of its dense leg (e5-small for the shipped one)
        args.encoder = plan.encoder
    setup = RunSetup.from_args(args)
    run_config.check_corpus(args, setup.identity())
    answer_aliases = apply_aliases(args, setup.questions)  # extends 2Wiki answers in place when --aliases is given
    if setup.missing_gold_warning():
        print(f"effrag: warning: {setup.missing_gold_warning()}", file=sys.stderr)
    questions, retriever, kind = setup.questions, setup.retriever, setup.kind
    if cls.uses_dataset and questions[0].dataset != plan.dataset:  # the settings for the questions' own dataset
        plan = cls.plan(method_opts, dataset=questions[0].dataset, **depth)
    for warning in plan.warnings(kind, retriever, args.index):
        print(f"effrag: warning: {warning}", file=sys.stderr)
    # --llm and the questions' dataset (few-shot prompts), as the method declares it uses them
    llm_opts = {key: v for key, v in llm_options(cls, args.llm, questions[0].dataset).items()
                if key not in method_opts}
    llm_opts.update(reader_opts)
    pipeline = plan.build(retriever, **llm_opts)
    if getattr(pipeline, "config_source", None):  # e.g. EfficientRAG's loop-<dataset>.json for these questions
        print(f"effrag: {pipeline.name} loop config: {pipeline.config_source}", file=sys.stderr)
    out = Path(args.output)
    if args.overwrite and out.exists():
        shutil.rmtree(out)
    # the method's checkpoints (EfficientRAG's Labeler/Filter, IRRR): a model retrained at the same path never resumes
    model_files = {key: fp for key, v in method_opts.items()
                   if isinstance(v, (str, Path)) and (fp := model_fingerprint(resolve_model(v))) is not None}
    config = {"method": pipeline.name, **setup.identity(), **({"model_files": model_files} if model_files else {}),
              "index_type": args.index_type if kind != "bm25" else None,
              "bf16": args.bf16, "k": ks, "limit": args.limit, "batch_size": args.batch_size,
              "method_options": method_opts, "llm": args.llm, "answer_aliases": answer_aliases,
              **({"reader": {"path": args.reader, "mode": args.reader_mode, "context": args.reader_context,
                             "model": model_fingerprint(resolve_model(args.reader), with_options=True)}}  # retrained: no resume
                 if args.reader else {}),
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


def command_entry_points() -> list:
    """The installed entry points of :data:`COMMAND_GROUP`, one per command name (the first found)."""
    from importlib.metadata import entry_points

    seen: dict[str, object] = {}
    for ep in entry_points(group=COMMAND_GROUP):
        seen.setdefault(ep.name, ep)
    return list(seen.values())


def build_parser(argv: list[str] | None = None, commands: tuple = ()) -> argparse.ArgumentParser:
    """The ``effrag`` parser: effrag's subcommands, the installed entry points' and ``commands`` (``add_*_parser``
    functions a caller outside effrag brings, e.g. ``python -m data_synthesis.cli``)."""
    parser = _Parser(prog="effrag", description="Multi-hop retrieval toolkit: EfficientRAG, IRRR and peers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for spec in SUBCOMMANDS:
        module, func = spec.split(":")
        getattr(importlib.import_module(module), func)(sub)
    for add in commands:
        add(sub)
    for ep in command_entry_points():
        if ep.name not in sub.choices:
            ep.load()(sub)
    argv = argv or []
    if argv[:1] and argv[0] in DATA_COMMANDS and argv[0] not in sub.choices:
        raise ValueError(f"`effrag {argv[0]}` is a command of the project's data_synthesis package, which is not "
                         f"installed here (no {COMMAND_GROUP} entry point): install effrag with its data_synthesis "
                         "package: pip install -e .")
    if argv[:1] == ["eval"] and "eval" in sub.choices:
        from effrag import run_config
        from effrag.cli_args import add_method_args

        config = run_config.read(_peek(argv, "--config")) if _peek(argv, "--config") else None
        method = _peek(argv, "--method") or (run_config.method_of(config) if config else None) or DEFAULT_METHOD
        add_method_args(sub.choices["eval"], method)
        if config is not None:
            run_config.apply(sub.choices["eval"], config)
    return parser


def main(argv: list[str] | None = None, commands: tuple = ()) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv, commands)
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        args.func(args)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
            ValueError) as e:
        print(f"effrag: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a full disk, an I/O error: one line naming the file (finished work stays resumable)
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"effrag: error: {where}{' '.join((e.strerror or str(e)).split())}"
              + (" (the disk is full: free space and rerun the same command)" if e.errno == errno.ENOSPC else ""),
              file=sys.stderr)
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
