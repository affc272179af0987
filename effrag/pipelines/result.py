"""What every method returns for a question: one :class:`Result` carrying ranked :class:`Chunk` objects.

A retriever's ``search`` gives :class:`~effrag.retrieval.base.Hit` objects (id, title, text,
score: what an index knows). A method turns the hits it keeps into chunks, which add what the
method knows: the hop (retrieval round) that found each one, the query that did, and for
EfficientRAG the Labeler's kept words. The same result object then serves every consumer: the
evaluation runner writes ``result.to_row()`` to ``predictions.jsonl``, the framework adapters and
``effrag serve`` read ``result.chunks`` and ``result.trace``, and the public API hands it to users
(``for c in result``, ``result.ids``, ``result.trace``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from effrag.text import join_words


@dataclass
class Chunk:
    """A passage in a method's result.

    ``score`` is the method's own score (EfficientRAG: p(<Continue>); IRRR: the answerability of
    its answer; single-shot and LLM methods: the retriever's score) and ``retrieval_score`` the
    retriever's. ``hop`` is the retrieval round that first found the chunk (0: the question's own
    retrieval), ``query`` the query of that round. ``kept_words`` are the words EfficientRAG's
    Labeler kept (empty for other methods); ``fallback`` marks a chunk a method added without
    selecting it (EfficientRAG's ``min_candidates`` top-up, or a <Terminate> chunk of a ``seen`` pool).
    ``retrieval_rank`` is the chunk's 0-based rank in its query's hits and ``rank_score`` the pool ranker's
    relevance logit (EfficientRAG with a ranker; None where a method has none).
    """

    id: str
    title: str
    text: str
    score: float
    hop: int = 0
    kept_words: list[str] = field(default_factory=list)
    query: str = ""
    retrieval_score: float = 0.0
    fallback: bool = False
    retrieval_rank: int | None = None
    rank_score: float | None = None

    @property
    def kept_text(self) -> str:
        return join_words(self.kept_words)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hit(cls, hit: Any, hop: int = 0, query: str = "", score: float | None = None) -> "Chunk":
        """A chunk from a retriever's :class:`~effrag.retrieval.base.Hit`, a chunk, a dict or any object
        with ``id`` and a string ``text`` (optionally ``title``, ``score``, ``hop``, ``kept_words``, ``query``).

        ``score`` (default: the hit's) is the method's score; the hit's own score is kept as ``retrieval_score``.
        """
        if isinstance(hit, Chunk):
            return hit
        get = hit.get if isinstance(hit, dict) else (lambda name, default=None: getattr(hit, name, default))
        cid, text = get("id"), get("text")
        if cid is None or not isinstance(text, str):
            raise TypeError(f"cannot read a chunk from {type(hit).__name__} {hit!r}: need 'id' and a string 'text'")
        hit_score = get("score")
        hit_score = float(hit_score) if hit_score is not None else 0.0
        return cls(id=str(cid), title=str(get("title") or ""), text=text,
                   score=hit_score if score is None else float(score), hop=int(get("hop", hop) or 0),
                   kept_words=list(get("kept_words") or []), query=str(get("query") or query),
                   retrieval_score=float(get("retrieval_score", hit_score) or 0.0))


@dataclass
class Result:
    """One question's outcome, from any method.

    ``chunks`` are ranked best (or first retrieved) first; the result reads as the list of its
    chunks (``for c in result``, ``result[0]``, ``len(result)``; empty, it is falsy like an empty
    list), which is what the public API's ``rag.retrieve(question)`` promises. ``answer`` is None for a retrieval-only run. ``trace`` is the
    method's own record of how it got there (EfficientRAG: per hop the queries, tags, kept words and
    next queries). ``iterations`` counts the method's rounds. ``timing`` splits the method's time
    (seconds) where it measures that. ``extra`` holds the method-specific fields of its predictions
    row (``parse_failures``, ``method_latency_s``, ``paragraphs_read``, ...), written as they are.
    """

    question: str
    chunks: list[Chunk] = field(default_factory=list)
    answer: str | None = None
    trace: Any = None
    iterations: int = 1
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timing: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ the chunks as a sequence
    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index):
        return self.chunks[index]

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.chunks]

    @property
    def scores(self) -> list[float]:
        return [float(c.score) for c in self.chunks]

    # ------------------------------------------------------------------ LLM usage
    def add_usage(self, llm_calls: int = 0, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.llm_calls += int(llm_calls)
        self.prompt_tokens += int(prompt_tokens)
        self.completion_tokens += int(completion_tokens)

    # ------------------------------------------------------------------ serialised forms
    def to_row(self) -> dict[str, Any]:
        """The method's fields of a ``predictions.jsonl`` row (the runner adds qid, gold, answers, latency).

        ``retrieved``/``scores`` are the chunk ids and scores in rank order; ``answer`` and ``trace``
        appear only when set; ``timing`` values are rounded to microseconds.
        """
        row: dict[str, Any] = {"retrieved": self.ids, "scores": self.scores, "llm_calls": self.llm_calls,
                               "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                               "iterations": self.iterations}
        if self.answer is not None:
            row["answer"] = self.answer
        if self.trace is not None:
            row["trace"] = self.trace
        row.update(self.extra)
        if self.timing is not None:
            row["timing"] = {k: round(v, 6) for k, v in self.timing.items()}
        return row

    def to_json(self, include_trace: bool = True) -> dict[str, Any]:
        """The HTTP form (``effrag serve``): the question, full chunks (with ``kept_text``), the other
        row fields under ``info``, and the trace unless left out."""
        info = {k: v for k, v in self.to_row().items() if k not in ("retrieved", "scores", "trace")}
        out: dict[str, Any] = {"question": self.question,
                               "chunks": [{**c.to_json(), "kept_text": c.kept_text} for c in self.chunks],
                               "info": info}
        if include_trace:
            out["trace"] = self.trace
        return out
