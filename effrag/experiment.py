"""The run-setup layer: questions -> corpus -> retriever -> gold, built in one place.

Every command line, script and service that runs a method over questions (``effrag eval``,
``effrag serve``, the quickstart, the benchmark and tuning scripts, synthesis) builds its inputs
here rather than re-deriving them, so that the corpus a question is scored against, the cache an
index is found in, and the treatment of gold passages missing from the corpus are the same
everywhere. As in pyserini, the command-line options come in shared argument groups::

    p = argparse.ArgumentParser()
    add_run_args(p)                       # --questions/--dataset/--limit, corpus and retriever options
    setup = RunSetup.from_args(p.parse_args())
    setup.questions, setup.corpus, setup.retriever, setup.gold, setup.describe()

or, from Python, ``RunSetup.build("dev.jsonl", corpus_from=["train.jsonl"], retriever="dense")``.
"""
from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

RETRIEVER_KINDS = ("dense", "bm25", "hybrid", "milvus")


def default_cache_dir() -> Path:
    """Where indexes built on the fly are cached: ``$EFFRAG_CACHE_DIR`` or ``~/.cache/effrag/indexes``."""
    return Path(os.environ.get("EFFRAG_CACHE_DIR", Path.home() / ".cache" / "effrag" / "indexes"))


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


def dataset_file(data_dir: str | Path, dataset: str, split: str) -> Path:
    """``<data_dir>/<dataset>/<split>.jsonl`` (the layout of ``../shared/data``), checked to exist."""
    path = Path(data_dir) / dataset / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {split} file for {dataset} under {data_dir}")
    return path


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
    g.add_argument("--encoder", metavar="PATH", help="local HF encoder folder (default: all-MiniLM-L6-v2)")
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


def retriever_options(kind: str, index_type: str = "flat", bm25_article: bool = False) -> dict[str, Any]:
    """Options of :func:`effrag.retrieval.build_retriever` for ``kind`` from the command-line values."""
    opts: dict[str, Any] = {"index_type": index_type} if kind != "bm25" else {}
    if bm25_article:
        if kind in ("dense", "milvus"):
            raise ValueError("--bm25-article needs --retriever bm25 or hybrid")
        opts["article"] = True
    return opts


# ---------------------------------------------------------------------------- corpus and retriever
def open_corpus(corpus: Any = None, corpus_from: Sequence[str | Path] = (), questions_path: str | Path | None = None,
                dataset: str | None = None, max_words: int | None = None):
    """A :class:`~effrag.data.Corpus`: given, read from ``corpus.jsonl`` or a folder of text files (split into
    passages of at most ``max_words`` words, :mod:`effrag.data.documents`), or pooled from dataset files.

    ``corpus_from`` pools those files' contexts plus ``questions_path``'s own, so that every question's
    gold passages are in its corpus (as in the papers' setting of a corpus of train + dev contexts).
    """
    from effrag.data import Corpus, build_corpus
    from effrag.data.documents import DEFAULT_MAX_WORDS, open_documents

    if corpus is not None and corpus_from:
        raise ValueError("give either --corpus or --corpus-from, not both")
    if corpus is not None:
        return corpus if isinstance(corpus, Corpus) else open_documents(corpus, max_words or DEFAULT_MAX_WORDS)
    if corpus_from:
        files = [*corpus_from, *([questions_path] if questions_path is not None else [])]
        return build_corpus(list(dict.fromkeys(map(str, files))), dataset)
    raise ValueError("no corpus: give --corpus-from FILE..., --corpus corpus.jsonl or --index DIR")


def open_retriever(kind: str, corpus, *, cache_dir: str | Path | None = None, encoder: str | None = None,
                   bf16: bool = False, index_type: str = "flat", bm25_article: bool = False, cache: bool = True,
                   **options: Any):
    """A ``dense``/``bm25``/``hybrid``/``milvus`` retriever over ``corpus``, from the index cache or built into it.

    ``cache=False`` builds in memory (BM25 over a small corpus is faster to build than to load).
    """
    from effrag.retrieval import build_retriever, cached_retriever

    if kind not in RETRIEVER_KINDS:
        raise ValueError(f"unknown retriever {kind!r}; choose from {', '.join(RETRIEVER_KINDS)}")
    opts = {**retriever_options(kind, index_type, bm25_article), **options}
    if not cache:
        return build_retriever(kind, corpus, encoder_path=encoder, bf16=bf16, **opts)
    return cached_retriever(kind, corpus, cache_dir or default_cache_dir(), encoder_path=encoder, bf16=bf16, **opts)


def open_index(index: str | Path, *, kind: str | None = None, corpus: Any = None, encoder: str | None = None,
               bf16: bool = False, **runtime: Any):
    """A saved index (``effrag index build``); ``kind``, when given, must be the kind it holds (``dense`` also
    names a Milvus index: its vectors are the same dense ones, stored in Milvus instead of a FAISS file)."""
    from effrag.data import Corpus
    from effrag.retrieval import load_retriever
    from effrag.retrieval.meta import read_meta

    held = read_meta(index)["kind"]
    if kind and kind != held and not (kind == "dense" and held == "milvus"):
        raise ValueError(f"--retriever {kind} but {index} holds a {held} index (leave --retriever out with --index: "
                         "the index says what it is)")
    if corpus is not None and not isinstance(corpus, Corpus):
        corpus = Corpus.from_jsonl(corpus)
    return load_retriever(index, corpus=corpus, encoder_path=encoder, bf16=bf16, **runtime)


def encoder_path(retriever) -> str | None:
    """The dense encoder folder of a retriever (or of a hybrid's parts), for run configs."""
    for r in [retriever, *getattr(retriever, "retrievers", [])]:
        if getattr(r, "encoder", None) is not None:
            return str(r.encoder.path)
    return None


# ---------------------------------------------------------------------------- the run setup
@dataclass
class RunSetup:
    """Questions, the corpus they are asked over, its retriever, and each question's gold corpus ids.

    ``gold`` counts gold passages missing from the corpus as never retrieved (a ``missing:<title>``
    id), so recall is never inflated by a corpus that lacks them; ``missing_gold`` says how many.
    """

    questions: list
    corpus: Any
    retriever: Any
    gold: list[list[str]]
    kind: str
    sources: dict[str, Any] = field(default_factory=dict)
    missing_gold: int = 0
    gold_total: int = 0

    @property
    def dataset(self) -> str:
        return self.questions[0].dataset

    @property
    def texts(self) -> list[str]:
        return [q.question for q in self.questions]

    @classmethod
    def build(cls, questions: Any, *, dataset: str | None = None, limit: int | None = None,
              sample: int | None = None, seed: int = 0, corpus: Any = None, corpus_from: Sequence[str | Path] = (),
              index: str | Path | None = None, retriever: Any = "dense", encoder: str | None = None,
              index_type: str = "flat", bf16: bool = False, bm25_article: bool = False,
              cache_dir: str | Path | None = None, cache: bool = True, own_contexts: bool = False) -> "RunSetup":
        """Load everything a run needs.

        ``questions`` is a dataset file or a list of :class:`~effrag.data.Question`; ``limit`` keeps
        the first N, ``sample`` draws N with ``seed`` (kept in file order). The passages come from
        ``index`` (a saved index), ``corpus`` (a Corpus or corpus.jsonl) or ``corpus_from`` (files whose
        contexts are pooled with the questions' own). ``retriever`` is a kind (``dense``, ``bm25``,
        ``hybrid``) or an object with ``search(queries, k)`` already built over ``corpus``.
        ``own_contexts=True`` lets a questions file with no corpus option be its own corpus (its contexts).
        """
        from effrag.data import load_questions, map_gold
        from effrag.data.hf_layouts import is_hf_object

        qpath, corpus_arg, corpus_from_arg = None, corpus, list(corpus_from)
        if is_hf_object(questions):  # a datasets.Dataset / DatasetDict in the Hugging Face layout
            questions = load_questions(questions, dataset, limit=limit)
            if not questions:
                raise ValueError("no questions in the given dataset object")
        elif isinstance(questions, (str, Path)):
            qpath = Path(questions)
            questions = load_questions(qpath, dataset, limit=limit)
            if not questions:
                raise ValueError(f"{qpath}: no questions")
        else:
            questions = list(questions)[:limit] if limit else list(questions)
            if not questions:
                raise ValueError("no questions")
        if sample and sample < len(questions):
            questions = sorted(random.Random(seed).sample(questions, sample), key=lambda q: q.id)
        kind = retriever if isinstance(retriever, str) or retriever is None else getattr(retriever, "kind", "custom")
        if index is not None:
            search = open_index(index, kind=kind if isinstance(retriever, str) else None, corpus=corpus,
                                encoder=encoder, bf16=bf16)
            corpus, kind = search.corpus, getattr(search, "kind", kind)
        else:
            if not kind:
                raise ValueError("--retriever is required unless --index is given")
            if own_contexts and corpus is None and not corpus_from and qpath is not None:
                corpus_from = [qpath]
            corpus = open_corpus(corpus, corpus_from, qpath, dataset)
            search = retriever if not isinstance(retriever, str) else open_retriever(
                kind, corpus, cache_dir=cache_dir, encoder=encoder, bf16=bf16, index_type=index_type,
                bm25_article=bm25_article, cache=cache)
        gold, rep = map_gold(questions, corpus, report=True)
        if rep.missing:
            gold = rep.counted_as_missed(questions, gold)
        sources = {"questions": str(qpath.resolve()) if qpath else None,
                   "corpus_from": [str(Path(f).resolve()) for f in corpus_from_arg],
                   "corpus": str(corpus_arg) if isinstance(corpus_arg, (str, Path)) else None,
                   "index": str(index) if index is not None else None}
        return cls(questions, corpus, search, gold, kind, sources, len(rep.missing), rep.total)

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, questions: Any = None, own_contexts: bool = False,
                  **overrides: Any) -> "RunSetup":
        """From the options of :func:`add_run_args` (missing ones take their defaults); see :meth:`build`."""
        get = lambda name, default=None: overrides.get(name, getattr(args, name, default))  # noqa: E731
        return cls.build(
            questions if questions is not None else get("questions"), dataset=get("dataset"), limit=get("limit"),
            sample=get("n"), seed=get("seed", 0) or 0, corpus=get("corpus"), corpus_from=get("corpus_from", ()) or (),
            index=get("index"), retriever=get("retriever"), encoder=get("encoder"),
            index_type=get("index_type", "flat") or "flat", bf16=bool(get("bf16", False)),
            bm25_article=bool(get("bm25_article", False)), cache_dir=get("cache_dir"), own_contexts=own_contexts)

    def missing_gold_warning(self) -> str | None:
        """A one-line warning when some gold passages are not in the corpus (they count as not retrieved)."""
        if not self.missing_gold:
            return None
        return (f"{self.missing_gold} of {self.gold_total} gold passages are not in the corpus "
                "(counted as not retrieved)")

    def describe(self) -> dict[str, Any]:
        """The setup's fields of a run config (``config.json``): what was asked over what.

        The keys are those ``effrag eval`` has always written, so earlier output folders still resume.
        """
        return {"dataset": self.dataset, **self.sources, "retriever": self.kind,
                "corpus_fingerprint": self.corpus.fingerprint(), "corpus_size": len(self.corpus),
                "encoder": encoder_path(self.retriever)}
