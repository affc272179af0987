"""The run-setup layer: questions -> corpus -> retriever -> gold, built in one place, and the run's identity.

Every command line, script and service that runs a method over questions (``effrag eval``,
``effrag serve``, the quickstart, the benchmark and tuning scripts, synthesis) builds its inputs
here rather than re-deriving them, so that the corpus a question is scored against, the cache an
index is found in, and the treatment of gold passages missing from the corpus are the same
everywhere::

    setup = RunSetup.build("dev.jsonl", corpus_from=["train.jsonl"], retriever="dense")
    setup.questions, setup.corpus, setup.retriever, setup.gold, setup.identity()

or, from a command line whose parser has the shared argument groups (:mod:`effrag.cli_args`),
``RunSetup.from_args(args)``. A setup without questions (a corpus and its retriever, e.g. ``effrag serve``
or negative mining) is ``RunSetup.over_corpus(...)``.

:meth:`RunSetup.identity` is the one run identity: what was asked over what. Every resume check (an
evaluation's ``config.json``, a tuning folder's rows, synthesis and training-data folders, the quickstart's
stages) records it with its own settings and compares the two with :func:`check_same_run`.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RETRIEVER_KINDS = ("dense", "bm25", "hybrid", "milvus")


def default_cache_dir() -> Path:
    """Where indexes built on the fly are cached: ``$EFFRAG_CACHE_DIR/indexes``, else ``~/.cache/effrag/indexes``
    (:mod:`effrag.paths`)."""
    from effrag.paths import index_cache_dir

    return index_cache_dir()


def dataset_file(data_dir: str | Path, dataset: str, split: str) -> Path:
    """``<data_dir>/<dataset>/<split>.jsonl`` (the layout of ``../shared/data``), checked to exist."""
    path = Path(data_dir) / dataset / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {split} file for {dataset} under {data_dir}")
    return path


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
                dataset: str | None = None, max_words: int | None = None, *, skip_malformed: bool = False):
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
        return build_corpus(list(dict.fromkeys(map(str, files))), dataset, skip_malformed=skip_malformed)
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
    retriever = load_retriever(index, corpus=corpus, encoder_path=encoder, bf16=bf16, **runtime)
    retriever.index_dir = Path(index)  # where a system finds the chunk vectors built with it (effrag index build --system)
    return retriever


def as_retriever(retriever: Any, corpus: Any = None) -> Any:
    """A search object from a retriever (``search(queries, k)``), a saved index folder, or a function
    ``fn(queries, k)`` (:class:`~effrag.retrieval.function.FunctionRetriever`)."""
    if callable(getattr(retriever, "search", None)):
        return retriever
    if isinstance(retriever, (str, Path)):
        return open_index(retriever, corpus=corpus)
    if callable(retriever):
        from effrag.retrieval.function import FunctionRetriever

        return FunctionRetriever(retriever)
    raise TypeError(f"retriever must have search(queries, k), be an index directory or a function; "
                    f"got {type(retriever).__name__}")


def encoder_path(retriever) -> str | None:
    """The dense encoder folder of a retriever (or of a hybrid's parts), for run configs."""
    for r in [retriever, *getattr(retriever, "retrievers", [])]:
        if getattr(r, "encoder", None) is not None:
            return str(r.encoder.path)
    return None


def encoder_mismatch(tuned: str | None, retriever, method: str = "the method") -> str | None:
    """A one-line warning when ``retriever``'s dense encoder is not the one ``method``'s settings were tuned over
    (``tuned``, an alias; None: nothing to compare): a loop config tuned over e5-small's candidates run over an
    index encoded with MiniLM gives other figures than its own, with nothing else saying so."""
    used = encoder_path(retriever)
    if tuned is None or used is None:
        return None
    from effrag.models.encoders import encoder_alias

    alias = encoder_alias(used)
    if alias == tuned:
        return None
    return (f"{method}'s loop config was tuned over the {tuned} encoder; this run's dense retrieval uses "
            f"{alias or used}, whose candidates it was not tuned on (give --encoder {tuned}, or an index built with it)")


# ---------------------------------------------------------------------------- the run setup
# The keys of RunSetup.identity(), and the identity's schema number: a record of another schema (or of none: written
# before 2026-11-29, when a record could lack some of these keys) differs in "schema" and never resumes.
IDENTITY_KEYS = ("schema", "dataset", "questions", "corpus_from", "corpus", "index", "retriever", "corpus_fingerprint",
                 "corpus_size", "encoder")
IDENTITY_SCHEMA = 2


@dataclass
class RunSetup:
    """Questions, the corpus they are asked over, its retriever, and each question's gold corpus ids.

    ``gold`` counts gold passages missing from the corpus as never retrieved (a ``missing:<title>``
    id), so recall is never inflated by a corpus that lacks them; ``missing_gold`` says how many.
    A setup built without questions (``questions=None``) is a corpus and its retriever only (or the corpus
    alone, with ``retriever=None``: :meth:`over` gives it retrievers), which :meth:`ask` gives questions.
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
    def dataset(self) -> str | None:
        return self.questions[0].dataset if self.questions else None

    @property
    def texts(self) -> list[str]:
        return [q.question for q in self.questions]

    @classmethod
    def build(cls, questions: Any = None, *, dataset: str | None = None, limit: int | None = None,
              sample: int | None = None, seed: int = 0, corpus: Any = None, corpus_from: Sequence[str | Path] = (),
              index: str | Path | None = None, retriever: Any = "dense", encoder: str | None = None,
              index_type: str = "flat", bf16: bool = False, bm25_article: bool = False,
              cache_dir: str | Path | None = None, cache: bool = True, own_contexts: bool = False,
              skip_malformed: bool = False, retriever_options: Mapping[str, Any] | None = None) -> RunSetup:
        """Load everything a run needs.

        ``questions`` is a dataset file or a list of :class:`~effrag.data.Question` (or None: a corpus and
        its retriever only); ``limit`` keeps the first N, ``sample`` draws N with ``seed`` (kept in file
        order). The passages come from ``index`` (a saved index), ``corpus`` (a Corpus, corpus.jsonl or a folder
        of text files) or ``corpus_from`` (files whose contexts are pooled with the questions' own; with
        ``skip_malformed`` a record :func:`~effrag.data.load_questions` rejects is left out, as synthesis does).
        ``retriever`` is a kind (``dense``, ``bm25``, ``hybrid``, ``milvus``) or an object with
        ``search(queries, k)`` already built over ``corpus``; ``retriever_options`` go to the index (loaded
        or built; e.g. ``show_progress``, ``nprobe``). ``own_contexts=True`` lets a questions file with no
        corpus option be its own corpus (its contexts).
        """
        qpath = Path(questions) if isinstance(questions, (str, Path)) else None
        questions = _load_questions(questions, dataset, limit, sample, seed)
        corpus_arg, corpus_from_arg = corpus, list(corpus_from)
        options = dict(retriever_options or {})
        # a service config's retriever options may name these
        index_type, bm25_article = options.pop("index_type", index_type), options.pop("bm25_article", bm25_article)
        encoder, bf16 = options.pop("encoder", encoder), options.pop("bf16", bf16)
        kind = retriever if isinstance(retriever, str) or retriever is None else getattr(retriever, "kind", "custom")
        if index is not None:
            search = open_index(index, kind=kind if isinstance(retriever, str) else None, corpus=corpus,
                                encoder=encoder, bf16=bf16, **options)
            corpus, kind = search.corpus, getattr(search, "kind", kind)
        else:
            if not kind and questions is not None:
                raise ValueError("--retriever is required unless --index is given")
            if own_contexts and corpus is None and not corpus_from and qpath is not None:
                corpus_from = [qpath]
            corpus = open_corpus(corpus, corpus_from, qpath, dataset, skip_malformed=skip_malformed)
            if isinstance(retriever, str):
                search = open_retriever(kind, corpus, cache_dir=cache_dir, encoder=encoder, bf16=bf16,
                                        index_type=index_type, bm25_article=bm25_article, cache=cache, **options)
            else:
                search = retriever  # an object built over the corpus, or None (the corpus alone)
        sources = {"questions": str(qpath.resolve()) if qpath else None,
                   "corpus_from": [str(Path(f).resolve()) for f in corpus_from_arg],
                   "corpus": str(corpus_arg) if isinstance(corpus_arg, (str, Path)) else None,
                   "index": str(index) if index is not None else None}
        return cls([], corpus, search, [], kind, sources).ask(questions) if questions is not None else \
            cls([], corpus, search, [], kind, sources)

    def ask(self, questions: Any, *, dataset: str | None = None, limit: int | None = None) -> RunSetup:
        """These questions (a file or a list) over this setup's corpus and retriever, with their gold ids: one
        corpus and index serve several question files (a benchmark's datasets)."""
        from dataclasses import replace

        from effrag.data import map_gold

        qpath = Path(questions) if isinstance(questions, (str, Path)) else None
        questions = _load_questions(questions, dataset, limit, None, 0)
        gold, rep = map_gold(questions, self.corpus, report=True)
        if rep.missing:
            gold = rep.counted_as_missed(questions, gold)
        sources = {**self.sources, **({"questions": str(qpath.resolve())} if qpath else {})}
        return replace(self, questions=questions, gold=gold, sources=sources, missing_gold=len(rep.missing),
                       gold_total=rep.total)

    def over(self, retriever: Any, **options: Any) -> RunSetup:
        """The same questions and corpus under another retriever (a kind, built or taken from the cache, or an
        object); ``options`` as :func:`open_retriever`'s."""
        from dataclasses import replace

        if not isinstance(retriever, str):
            return replace(self, retriever=retriever, kind=getattr(retriever, "kind", "custom"))
        return replace(self, retriever=open_retriever(retriever, self.corpus, **options), kind=retriever)

    @classmethod
    def from_args(cls, args: Any, *, questions: Any = None, own_contexts: bool = False,
                  **overrides: Any) -> RunSetup:
        """From the options of :func:`effrag.cli_args.add_run_args` (missing ones take their defaults); see
        :meth:`build`."""
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

    def identity(self) -> dict[str, Any]:
        """The one run identity (:data:`IDENTITY_KEYS`): what was asked over what. Every resume check records it
        beside its own settings and compares with :func:`check_same_run`.

        ``schema`` (:data:`IDENTITY_SCHEMA`) numbers the identity's shape: a record of another shape never resumes.
        """
        return {"schema": IDENTITY_SCHEMA, "dataset": self.dataset, **self.sources, "retriever": self.kind,
                "corpus_fingerprint": self.corpus.fingerprint(), "corpus_size": len(self.corpus),
                "encoder": encoder_path(self.retriever)}



def _load_questions(questions: Any, dataset: str | None, limit: int | None, sample: int | None,
                    seed: int) -> list | None:
    """A run's questions from a file, a Hugging Face object or a list (None stays None)."""
    from effrag.data import load_questions
    from effrag.data.hf_layouts import is_hf_object

    if questions is None:
        return None
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
    return questions


# ---------------------------------------------------------------------------- the one resume check
def run_differences(recorded: Mapping[str, Any], current: Mapping[str, Any], *,
                    may_change: Sequence[str] = ()) -> list[str]:
    """The keys whose values differ between a recorded run and this one (compared as JSON holds them; a missing
    key reads as None), except ``may_change``."""
    import json

    recorded, current = (json.loads(json.dumps(d, default=str)) for d in (recorded, current))  # as files hold them
    keys = (set(recorded) | set(current)) - set(may_change)
    return sorted(k for k in keys if recorded.get(k) != current.get(k))


def same_run(recorded: Mapping[str, Any], current: Mapping[str, Any], *, may_change: Sequence[str] = ()) -> bool:
    return not run_differences(recorded, current, may_change=may_change)


def check_same_run(recorded: Mapping[str, Any] | None, current: Mapping[str, Any], where: str | Path, *,
                   what: str = "output", may_change: Sequence[str] = (),
                   hint: str = "use another output folder or --overwrite") -> None:
    """The one resume check: refuse, in one line naming ``where`` and the differing keys, to resume ``what`` was
    recorded under other settings. Nothing recorded yet (None) is a fresh start."""
    if recorded is None:
        return
    diff = run_differences(recorded, current, may_change=may_change)
    if diff:
        raise ValueError(f"{where} holds {what} of a different run (differs in: {', '.join(diff)}); {hint}")
