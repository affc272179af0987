"""effrag inside other RAG stacks: one source of chunks behind LangChain, LlamaIndex, Haystack and HTTP.

:class:`ChunkSource` wraps anything effrag retrieves with and gives every
adapter (and ``effrag serve``) the same call,
``retrieve_batch(questions, top_k=None, **options) -> list[Result]``
(:class:`effrag.pipelines.Result`: ranked chunks with scores, hops and kept words, the trace,
iterations, LLM usage, the answer when the method gives one):

* a registered pipeline (``effrag.pipelines.build_pipeline(...)``; ``run``/``run_batch``), of which
  :class:`effrag.EfficientRAG` is one;
* any object with ``retrieve_batch``/``retrieve`` returning results, or chunk lists whose items carry
  ``id, title, text, score`` and optionally ``hop, kept_words``;
* a retriever with ``search(queries, k)`` (BM25, dense, hybrid, a user's own), or a
  plain function ``fn(queries, k)``.

The framework adapters import their framework only when used (optional extras):
``EffragLangChainRetriever`` (``effrag[langchain]``), ``EffragLlamaIndexRetriever``
(``effrag[llamaindex]``), ``EffragHaystackRetriever`` (``effrag[haystack]``).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from effrag.pipelines.base import Pipeline
from effrag.pipelines.result import Chunk, Result

__all__ = ["ChunkSource", "as_source", "chunk_content", "chunk_metadata", "CONTENT_MODES",
           "EffragLangChainRetriever", "EffragLlamaIndexRetriever", "EffragHaystackRetriever"]

# What a framework document holds as its text: the passage, "title: passage", or the
# Labeler's kept words (EfficientRAG's compressed context; the passage when nothing was kept).
CONTENT_MODES = ("text", "title_text", "kept_words")

def chunk_content(chunk: Chunk, mode: str = "text") -> str:
    if mode == "kept_words" and chunk.kept_words:
        return chunk.kept_text
    if mode == "title_text" and chunk.title:
        return f"{chunk.title}: {chunk.text}"
    return chunk.text


def chunk_metadata(chunk: Chunk, rank: int) -> dict[str, Any]:
    """The metadata every adapter attaches: passage id, title, score, hop, kept words, rank, query."""
    return {"id": chunk.id, "title": chunk.title, "score": chunk.score, "hop": chunk.hop,
            "kept_words": list(chunk.kept_words), "rank": rank, "query": chunk.query}


def _check_mode(mode: str) -> str:
    if mode not in CONTENT_MODES:
        raise ValueError(f"content must be one of {CONTENT_MODES}, got {mode!r}")
    return mode


class ChunkSource:
    """Anything effrag retrieves with, behind ``retrieve_batch(questions, top_k=None, **options)``.

    ``k`` is the depth asked of a plain ``search`` retriever; ``top_k`` per call
    overrides it (search) or truncates the ranked list (pipelines: their pool size is decided by the
    method). ``options`` are settings for this call only, those the pipeline declares
    (:attr:`~effrag.pipelines.Pipeline.call_options`; EfficientRAG's loop settings: ``tag_threshold=``,
    ``max_hops=``, ...). Calls are serialised by a lock, because per-call options swap the method's config.
    """

    def __init__(self, obj: Any, *, k: int = 10):
        if isinstance(obj, ChunkSource):
            obj = obj.obj
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.obj, self.k = obj, k
        self._lock = threading.RLock()
        if isinstance(obj, Pipeline):
            self.kind = "pipeline"
        elif callable(getattr(obj, "retrieve_batch", None)) or callable(getattr(obj, "retrieve", None)):
            self.kind = "retrieve"
        elif callable(getattr(obj, "run_batch", None)) or callable(getattr(obj, "run", None)):
            self.kind = "pipeline"
        elif callable(getattr(obj, "search", None)):
            self.kind = "search"
        elif callable(obj):
            from effrag.api import FunctionRetriever

            self.obj, self.kind = FunctionRetriever(obj), "search"
        else:
            raise TypeError(f"cannot retrieve with a {type(obj).__name__}: expected a pipeline (run/run_batch; "
                            "EfficientRAG is one), an object with retrieve(question) or search(queries, k), or a "
                            "function")

    # ------------------------------------------------------------------ description
    @property
    def options(self) -> frozenset[str]:
        """Names of the per-call options this source accepts (what its pipeline declares)."""
        return frozenset(getattr(self.obj, "call_options", ())) if self.kind == "pipeline" else frozenset()

    @property
    def method(self) -> str:
        return getattr(self.obj, "name", None) if self.kind == "pipeline" else self.kind

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "kind": self.kind, "object": type(self.obj).__name__}
        if self.options:
            out["config"] = self.obj.config.to_json()
        if self.kind == "search":
            out["k"] = self.k
        return out

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, question: str, top_k: int | None = None, **options: Any) -> Result:
        return self.retrieve_batch([question], top_k=top_k, **options)[0]

    def retrieve_batch(self, questions: Sequence[str], top_k: int | None = None, **options: Any) -> list[Result]:
        if isinstance(questions, str):
            raise TypeError("retrieve_batch takes a list of questions; use retrieve(question) for one")
        questions = list(questions)
        for i, q in enumerate(questions):
            if not isinstance(q, str) or not q.strip():
                raise ValueError(f"question {i} is empty or not a string: {q!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        options = {k: v for k, v in options.items() if v is not None}
        unknown = sorted(set(options) - self.options)
        if unknown:
            allowed = ", ".join(sorted(self.options)) or "none"
            raise ValueError(f"method {self.method} does not take option(s) {', '.join(unknown)} (allowed: {allowed})")
        if not questions:
            return []
        with self._lock:
            saved = self.obj.config if options else None
            try:
                if options:
                    self.obj.config = saved.replace(**options)
                results = self._run(questions, top_k)
            finally:
                if options:
                    self.obj.config = saved
        if top_k is not None:
            for r in results:
                r.chunks = r.chunks[:top_k]
        return results

    def _run(self, questions: list[str], top_k: int | None) -> list[Result]:
        if self.kind == "search":
            hits = self.obj.search(questions, top_k or self.k)
            return [Result(q, [Chunk.from_hit(h, query=q) for h in hs],
                           hops=[{"hop": 0, "queries": [q], "retrieved": [h.id for h in hs]}])
                    for q, hs in zip(questions, hits)]
        if self.kind == "retrieve":
            if callable(getattr(self.obj, "retrieve_batch", None)):
                results = self.obj.retrieve_batch(questions)
            else:
                results = [self.obj.retrieve(q) for q in questions]
            return [_as_result(q, r) for q, r in zip(questions, results)]
        results = self.obj.run_batch(questions) if callable(getattr(self.obj, "run_batch", None)) \
            else [self.obj.run(q) for q in questions]
        for r in results:
            if not isinstance(r, Result):
                raise TypeError(f"pipeline {type(self.obj).__name__} returned a {type(r).__name__}; a pipeline "
                                "returns effrag.pipelines.Result objects")
        return list(results)


def _as_result(question: str, result: Any) -> Result:
    """A ``retrieve`` object's answer as a Result: a Result as it is, else a list of chunk-like items
    (carrying ``trace``, ``iterations``, ``timing`` as attributes when it has them)."""
    if isinstance(result, Result):
        return result
    return Result(question, [Chunk.from_hit(c) for c in getattr(result, "chunks", result)],
                  trace=getattr(result, "trace", None), iterations=getattr(result, "iterations", 1),
                  timing=getattr(result, "timing", None))


def as_source(obj: Any, *, k: int = 10) -> ChunkSource:
    """``obj`` as a :class:`ChunkSource` (a ChunkSource passes through unchanged)."""
    if isinstance(obj, ChunkSource):
        return obj
    return ChunkSource(obj, k=k)


_ADAPTERS = {"EffragLangChainRetriever": "langchain", "EffragLlamaIndexRetriever": "llamaindex",
             "EffragHaystackRetriever": "haystack"}


def __getattr__(name: str) -> Any:  # adapters import their framework only when asked for
    if name in _ADAPTERS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_ADAPTERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
