"""effrag inside other RAG stacks: one source of chunks behind LangChain, LlamaIndex, Haystack and HTTP.

:class:`ChunkSource` wraps anything effrag retrieves with and gives every
adapter (and ``effrag serve``) the same call,
``retrieve_batch(questions, top_k=None, **options) -> list[Retrieval]``:

* an :class:`effrag.EfficientRAG` (or any object with ``retrieve_batch``/``retrieve``
  returning chunks that carry ``id, title, text, score`` and optionally ``hop, kept_words``);
* a registered pipeline (``effrag.pipelines.build_pipeline(...)``; ``run``/``run_batch``
  returning ``retrieved`` ids, turned back into passages through the retriever's corpus);
* a retriever with ``search(queries, k)`` (BM25, dense, hybrid, a user's own), or a
  plain function ``fn(queries, k)``.

The framework adapters import their framework only when used (optional extras):
``EffragLangChainRetriever`` (``effrag[langchain]``), ``EffragLlamaIndexRetriever``
(``effrag[llamaindex]``), ``EffragHaystackRetriever`` (``effrag[haystack]``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from effrag.pipelines.efficientrag import Chunk, EfficientRAGConfig

__all__ = ["ChunkSource", "Retrieval", "as_source", "to_chunk", "chunk_content", "chunk_metadata",
           "CONTENT_MODES", "EffragLangChainRetriever", "EffragLlamaIndexRetriever", "EffragHaystackRetriever"]

# What a framework document holds as its text: the passage, "title: passage", or the
# Labeler's kept words (EfficientRAG's compressed context; the passage when nothing was kept).
CONTENT_MODES = ("text", "title_text", "kept_words")
# Per-call options an EfficientRAG source accepts (fields of EfficientRAGConfig).
EFFICIENTRAG_OPTIONS = frozenset(f.name for f in fields(EfficientRAGConfig))


@dataclass
class Retrieval:
    """One question's result: ranked chunks, the method's trace, and other method outputs (``info``)."""

    question: str
    chunks: list[Chunk]
    trace: Any = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.chunks]

    def to_json(self, include_trace: bool = True) -> dict[str, Any]:
        out = {"question": self.question,
               "chunks": [{**c.to_json(), "kept_text": c.kept_text} for c in self.chunks], "info": self.info}
        if include_trace:
            out["trace"] = self.trace
        return out


def to_chunk(item: Any, hop: int = 0) -> Chunk:
    """A :class:`Chunk` from an effrag Chunk, a :class:`~effrag.retrieval.base.Hit`, a dict or any object
    with ``id``, ``text`` (and optionally ``title``, ``score``, ``hop``, ``kept_words``)."""
    if isinstance(item, Chunk):
        return item
    get = item.get if isinstance(item, dict) else (lambda name, default=None: getattr(item, name, default))
    cid, text = get("id"), get("text")
    if cid is None or not isinstance(text, str):
        raise TypeError(f"cannot read a chunk from {type(item).__name__} {item!r}: need 'id' and a string 'text'")
    score = get("score")
    return Chunk(id=str(cid), title=str(get("title") or ""), text=text,
                 score=float(score) if score is not None else 0.0, hop=int(get("hop", hop) or 0),
                 kept_words=list(get("kept_words") or []), query=str(get("query") or ""),
                 retrieval_score=float(get("retrieval_score", score) or 0.0))


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
    overrides it (search) or truncates the ranked list (EfficientRAG, pipelines:
    their pool size is decided by the method). ``options`` are EfficientRAG loop
    settings for this call only (``tag_threshold=``, ``max_hops=``, ...). Calls are
    serialised by a lock, because per-call options swap the method's config.
    """

    def __init__(self, obj: Any, *, k: int = 10, corpus: Any = None):
        if isinstance(obj, ChunkSource):
            obj = obj.obj
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.obj, self.k = obj, k
        self._lock = threading.RLock()
        self._config_holder = None
        if callable(getattr(obj, "retrieve_batch", None)) or callable(getattr(obj, "retrieve", None)):
            self.kind = "retrieve"
            self._config_holder = obj
        elif callable(getattr(getattr(obj, "loop", None), "run", None)):
            self.kind = "loop"  # the registered efficientrag pipeline: its loop gives chunks with kept words
            self._config_holder = obj.loop
        elif callable(getattr(obj, "run_batch", None)) or callable(getattr(obj, "run", None)):
            self.kind = "pipeline"
            self.corpus = corpus if corpus is not None else _find_corpus(obj)
        elif callable(getattr(obj, "search", None)):
            self.kind = "search"
        elif callable(obj):
            from effrag.api import FunctionRetriever

            self.obj, self.kind = FunctionRetriever(obj), "search"
        else:
            raise TypeError(f"cannot retrieve with a {type(obj).__name__}: expected an EfficientRAG, a pipeline "
                            "(run/run_batch), an object with retrieve(question) or search(queries, k), or a function")
        if not isinstance(getattr(self._config_holder, "config", None), EfficientRAGConfig):
            self._config_holder = None

    # ------------------------------------------------------------------ description
    @property
    def options(self) -> frozenset[str]:
        """Names of the per-call options this source accepts."""
        return EFFICIENTRAG_OPTIONS if self._config_holder is not None else frozenset()

    @property
    def method(self) -> str:
        if self._config_holder is not None:
            return "efficientrag"
        return getattr(self.obj, "name", None) if self.kind == "pipeline" else self.kind

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "kind": self.kind, "object": type(self.obj).__name__}
        if self._config_holder is not None:
            out["config"] = self._config_holder.config.to_json()
        if self.kind == "search":
            out["k"] = self.k
        return out

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, question: str, top_k: int | None = None, **options: Any) -> Retrieval:
        return self.retrieve_batch([question], top_k=top_k, **options)[0]

    def retrieve_batch(self, questions: Sequence[str], top_k: int | None = None, **options: Any) -> list[Retrieval]:
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
            holder = self._config_holder
            saved = holder.config if holder is not None else None
            try:
                if options:
                    holder.config = saved.replace(**options)
                results = self._run(questions, top_k)
            finally:
                if options:
                    holder.config = saved
        if top_k is not None:
            for r in results:
                r.chunks = r.chunks[:top_k]
        return results

    def _run(self, questions: list[str], top_k: int | None) -> list[Retrieval]:
        if self.kind == "search":
            hits = self.obj.search(questions, top_k or self.k)
            return [Retrieval(q, [to_chunk(h) for h in hs], trace=[{"hop": 0, "queries": [q], "retrieved": [h.id for h in hs]}])
                    for q, hs in zip(questions, hits)]
        if self.kind == "loop":
            return [_from_result(q, r) for q, r in zip(questions, self.obj.loop.run(questions))]
        if self.kind == "retrieve":
            if callable(getattr(self.obj, "retrieve_batch", None)):
                results = self.obj.retrieve_batch(questions)
            else:
                results = [self.obj.retrieve(q) for q in questions]
            return [_from_result(q, r) for q, r in zip(questions, results)]
        outs = self.obj.run_batch(questions) if callable(getattr(self.obj, "run_batch", None)) \
            else [self.obj.run(q) for q in questions]
        return [self._from_output(q, out) for q, out in zip(questions, outs)]

    def _from_output(self, question: str, out: dict[str, Any]) -> Retrieval:
        """A pipeline's MethodOutput dict -> chunks looked up in the corpus."""
        if self.corpus is None:
            raise ValueError(f"pipeline {type(self.obj).__name__} returns passage ids only; pass corpus= "
                             "(or give the pipeline a retriever with a .corpus)")
        scores = list(out.get("scores") or [])
        chunks = []
        for rank, pid in enumerate(out.get("retrieved") or []):
            p = self.corpus[pid]
            chunks.append(Chunk(id=p.id, title=p.title, text=p.text,
                                score=float(scores[rank]) if rank < len(scores) else 0.0, hop=0))
        info = {k: v for k, v in out.items() if k not in ("retrieved", "scores", "trace")}
        return Retrieval(question, chunks, trace=out.get("trace"), info=info)


def _from_result(question: str, result: Any) -> Retrieval:
    """RetrievedChunks / LoopResult / a plain chunk list -> Retrieval."""
    items = getattr(result, "chunks", result)
    info = {k: getattr(result, k) for k in ("iterations", "timing") if hasattr(result, k)}
    return Retrieval(question, [to_chunk(c) for c in items], trace=getattr(result, "trace", None), info=info)


def _find_corpus(pipeline: Any) -> Any:
    for holder in (pipeline, getattr(pipeline, "retriever", None), getattr(getattr(pipeline, "loop", None), "retriever", None)):
        corpus = getattr(holder, "corpus", None)
        if corpus is not None:
            return corpus
    return None


def as_source(obj: Any, *, k: int = 10, corpus: Any = None) -> ChunkSource:
    """``obj`` as a :class:`ChunkSource` (a ChunkSource passes through unchanged)."""
    if isinstance(obj, ChunkSource):
        return obj
    return ChunkSource(obj, k=k, corpus=corpus)


_ADAPTERS = {"EffragLangChainRetriever": "langchain", "EffragLlamaIndexRetriever": "llamaindex",
             "EffragHaystackRetriever": "haystack"}


def __getattr__(name: str) -> Any:  # adapters import their framework only when asked for
    if name in _ADAPTERS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_ADAPTERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
