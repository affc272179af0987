"""The public API: EfficientRAG as a multi-hop retriever in a few lines.

    from effrag import EfficientRAG
    rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # the shipped system, its retriever
    rag = EfficientRAG.from_pretrained("checkpoints/efficientrag-all", retriever="indexes/hotpotqa-bm25")  # your own
    chunks = rag.retrieve("Who directed the film that ...?")   # a Result: reads as its chunk list
    for c in chunks:                 # ranked by hop, then p(<Continue>)
        print(c.hop, c.score, c.title, c.kept_text)
    chunks.trace                     # per hop: queries, retrieved ids, tags, kept words, next queries
    rag.answer("Who directed ...?", llm="default").answer

The retriever is anything with ``search(queries, k) -> list[list[Hit]]`` (the
FAISS, BM25 and hybrid indexes of :mod:`effrag.retrieval`), a saved index
directory, or a plain function ``fn(queries, k)`` returning hits as
:class:`~effrag.retrieval.base.Hit` objects or ``{"id", "title", "text", "score"}`` dicts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from effrag.pipelines.efficientrag import (EfficientRAGConfig, EfficientRAGLoop, build_config, load_models,
                                           loop_config, with_answers)
from effrag.pipelines.generation import Generator
from effrag.pipelines.result import Chunk, Result
from effrag.retrieval.base import Hit

__all__ = ["EfficientRAG", "EfficientRAGConfig", "Chunk", "Result", "FunctionRetriever"]


class FunctionRetriever:
    """Wraps ``fn(queries, k)`` into a retriever; dict hits become :class:`Hit` (errors name the bad field)."""

    def __init__(self, fn: Callable[[list[str], int], Sequence[Sequence[Any]]]):
        self.fn = fn

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results = self.fn(list(queries), k)
        if len(results) != len(queries):
            raise ValueError(f"retriever function returned {len(results)} hit lists for {len(queries)} queries")
        return [[self._hit(h, qi, r) for r, h in enumerate(hits)] for qi, hits in enumerate(results)]

    @staticmethod
    def _hit(h: Any, qi: int, rank: int) -> Hit:
        if isinstance(h, Hit):
            return h
        if isinstance(h, dict):
            missing = [f for f in ("id", "text") if f not in h]
            if missing:
                raise ValueError(f"retriever function: hit {rank} of query {qi} lacks field(s) {missing}: {h!r}")
            return Hit(id=str(h["id"]), title=str(h.get("title") or ""), text=str(h["text"]),
                       score=float(h.get("score", 0.0)))
        raise TypeError(f"retriever function: hit {rank} of query {qi} is a {type(h).__name__}, "
                        "expected Hit or dict with id/title/text/score")


def as_retriever(retriever: Any, corpus: Any = None) -> Any:
    """A search object from a retriever, a saved index directory, or a function."""
    if callable(getattr(retriever, "search", None)):
        return retriever
    if isinstance(retriever, (str, Path)):
        from effrag.retrieval import load_retriever

        return load_retriever(retriever, corpus=corpus)
    if callable(retriever):
        return FunctionRetriever(retriever)
    raise TypeError(f"retriever must have search(queries, k), be an index directory or a function; "
                    f"got {type(retriever).__name__}")


class EfficientRAG:
    """Labeler + Filter + retriever: iterative multi-hop retrieval without LLM calls."""

    def __init__(self, labeler, filter_model, retriever, config: EfficientRAGConfig | None = None, ranker=None):
        self.loop = EfficientRAGLoop(labeler, filter_model, as_retriever(retriever), config or EfficientRAGConfig(),
                                     ranker=ranker)
        self._generators: dict[tuple, Generator] = {}

    @classmethod
    def from_pretrained(cls, model: str | Path = "efficientrag-all", filter_dir: str | Path | None = None,
                        retriever: Any = None, *, corpus: Any = None,
                        config: EfficientRAGConfig | dict | str | None = None, dataset: str | None = None,
                        ranker: str | Path | None = None, **options: Any) -> "EfficientRAG":
        """A trained system: ``model`` is a system folder or a shipped name (``labeler/``, ``filter/``, ``[ranker/]``,
        ``loop.json``; :mod:`effrag.pipelines.efficientrag_system`), or, with ``filter_dir``, a Labeler checkpoint.

        ``config`` defaults to the system's ``loop-<dataset>.json`` when ``dataset`` names one, else its general
        ``loop.json``. ``retriever`` is a search object, an index folder, a function, or a kind (``"bm25"``,
        ``"dense"``, ``"hybrid"``) to build over ``corpus``; left out, the kind the loop config was tuned for is
        built over ``corpus``. ``options`` are :class:`EfficientRAGConfig` fields (``tag_threshold=``, ...).
        """
        from effrag.setup import RETRIEVER_KINDS, open_corpus, open_retriever
        from effrag.pipelines.efficientrag_system import config_retriever, open_system

        if filter_dir is None:
            system = open_system(model, config if isinstance(config, (str, Path)) else None, dataset)
            labeler_dir, filter_dir, ranker = system.labeler, system.filter, ranker or system.ranker
            config = config if config is not None else system.config
        else:
            labeler_dir = model
        cfg = build_config(config, **options)
        if retriever is None or (isinstance(retriever, str) and retriever in RETRIEVER_KINDS):
            kind = retriever or (config_retriever(config) if isinstance(config, (str, Path)) else None) or "dense"
            if corpus is None:
                raise ValueError(f"from_pretrained needs a retriever, or a corpus to build the {kind} retriever over")
            corpus = open_corpus(corpus)
            retriever = open_retriever(kind, corpus, bf16=True, cache=False)
        if cfg.pool_order != "rank" and cfg.labeler_top is None:
            ranker = None  # a system's ranker only reads when the config ranks by it
        models = load_models(labeler_dir, filter_dir, ranker=ranker)
        return cls(models[0], models[1], as_retriever(retriever, corpus), cfg,
                   ranker=models[2] if ranker is not None else None)

    config = loop_config

    @property
    def retriever(self) -> Any:
        return self.loop.retriever

    def retrieve(self, question: str) -> Result:
        """The question's :class:`Result`: iterate it for the ranked chunks; ``trace`` is the list of hops."""
        return self.retrieve_batch([question])[0]

    def retrieve_batch(self, questions: Sequence[str]) -> list[Result]:
        """All questions hop by hop together (same results as one at a time, higher throughput)."""
        if isinstance(questions, str):
            raise TypeError("retrieve_batch takes a list of questions; use retrieve(question) for one")
        return self.loop.run(list(questions))

    def answer(self, question: str, llm: Any = "default", *, dataset: str | None = None,
               context: str = "chunks", **generator_options: Any) -> Result:
        """Retrieve, then one LLM call with the paper's retrieval QA prompt for ``dataset``.

        ``llm`` is an :class:`effrag.llm.LLM` or a spec (``"default"`` = bundled SmolLM2);
        ``context="kept_words"`` sends only the Labeler's kept words (compressed context).
        The result is what ``effrag eval --method efficientrag --llm`` records for the question:
        ``answer``, the LLM usage, ``trace = {"hops": [...], "generation": {"raw": ...}}``.
        """
        key = (id(llm) if not isinstance(llm, str) else llm, dataset, context, tuple(sorted(generator_options.items())))
        gen = self._generators.get(key)
        if gen is None:
            gen = self._generators[key] = Generator(llm, dataset=dataset, context=context, **generator_options)
        return with_answers(self.retrieve_batch([question]), gen)[0]
