"""What every method returns for a question: one :class:`Result` carrying ranked :class:`Chunk` objects.

A retriever's ``search`` gives :class:`~effrag.retrieval.base.Hit` objects (id, title, text,
score: what an index knows). A method turns the hits it keeps into chunks, which add what the
method knows: the hop (retrieval round) that found each one, the query that did, and for
EfficientRAG the Labeler's kept words. How it got there is typed the same way for every method: its
retrieval rounds are :class:`Hop` records (``result.hops``), the answer step's record is
``result.generation``, and whatever else the method records (an LLM method's chain) is ``result.trace``.
The same result object then serves every consumer: the evaluation runner writes ``result.to_row()``
to ``predictions.jsonl`` and :meth:`Result.from_row` reads it back, the framework adapters and ``effrag
serve`` read ``result.chunks`` and ``result.trace_json()``, and the public API hands it to users
(``for c in result``, ``result.ids``, ``result.hops``).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

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
    relevance logit (EfficientRAG with a ranker; None where a method has none). ``order_score`` is the value the
    method's final order sorted by when that is not ``score`` (EfficientRAG's ``rank`` and ``fused`` pool orders:
    the ranker logit with its retrieval, link and requery terms; None where ``score`` itself decides the order).
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
    order_score: float | None = None

    @property
    def kept_text(self) -> str:
        return join_words(self.kept_words)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hit(cls, hit: Any, hop: int = 0, query: str = "", score: float | None = None) -> Chunk:
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


class Hop(dict):
    """One retrieval round of an iterative method, as the method recorded it (a dict: a row holds it as it is),
    with typed accessors for what every such method records: the round's queries, the chunks it read, the next
    queries and why it stopped.

    EfficientRAG records ``{"hop", "queries", "retrieved": [[ids] per query], "skipped_seen", "chunks": [{"id",
    "title", "query", "tag", "p_continue", "kept", "rank_score"?}], "filter_inputs", "next_queries", "stop"?,
    "rescored"?}``; IRRR a step ``{"query", "candidates": [ids], "answerability", "rerank", "best"?,
    "appended"?, "stop"?}``; a plain search one round ``{"hop": 0, "queries": [question], "retrieved": [ids]}``.
    """

    @property
    def queries(self) -> list[str]:
        if "queries" in self:
            return list(self["queries"])
        return [self["query"]] if "query" in self else []

    @property
    def read(self) -> list[str]:
        """Ids of the chunks the method read this round (EfficientRAG: the Labeler's pairs; IRRR: the candidates;
        a plain search: its hits)."""
        if "chunks" in self:
            return [c["id"] for c in self["chunks"]]
        if "candidates" in self:
            return list(self["candidates"])
        got = self.get("retrieved", [])
        return [i for ids in got for i in ids] if got and isinstance(got[0], list) else list(got)

    @property
    def chunks(self) -> list[dict]:
        """EfficientRAG: the record of each chunk the Labeler read (tag, p(<Continue>), kept words, ranker score)."""
        return list(self.get("chunks", []))

    @property
    def next_queries(self) -> list[str]:
        return list(self.get("next_queries", []))

    @property
    def stop(self) -> str | None:
        return self.get("stop")


@dataclass
class Result:
    """One question's outcome, from any method.

    ``chunks`` are ranked best (or first retrieved) first; the result reads as the list of its
    chunks (``for c in result``, ``result[0]``, ``len(result)``; empty, it is falsy like an empty
    list), which is what the public API's ``rag.retrieve(question)`` promises. ``answer`` is None for a
    retrieval-only run. ``hops`` are the method's retrieval rounds (:class:`Hop`: EfficientRAG's hops, IRRR's
    steps); ``generation`` is the answer step's record (the LLM's raw output, or the extractive reader's
    windows) when a generator answered; ``trace`` is the rest of the method's own record (an LLM method's chain,
    its stop reason). ``iterations`` counts the method's rounds. ``timing`` splits the method's time
    (seconds) where it measures that. ``extra`` holds the method-specific fields of its predictions
    row (``parse_failures``, ``method_latency_s``, ``paragraphs_read``, ...), written as they are.

    A ``trace`` given as a list of rounds, or as a dict with ``"hops"`` (the row form), is split into ``hops``
    and the rest on construction, so every way of building a result ends in the same typed form.
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
    hops: list[Hop] = field(default_factory=list)
    generation: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        hops, self.trace = _split_trace(self.trace)
        self.hops = [h if isinstance(h, Hop) else Hop(h) for h in [*self.hops, *hops]]

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

    @property
    def chunks_read(self) -> int:
        """How many chunks a model read to get this result: every round's reads (EfficientRAG's Labeler pairs,
        IRRR's candidates), or, for a method of one search, the chunks it returned (what a reader reads)."""
        return sum(len(h.read) for h in self.hops) if self.hops else len(self.chunks)

    # ------------------------------------------------------------------ LLM usage
    def add_usage(self, llm_calls: int = 0, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.llm_calls += int(llm_calls)
        self.prompt_tokens += int(prompt_tokens)
        self.completion_tokens += int(completion_tokens)

    # ------------------------------------------------------------------ serialised forms
    def trace_json(self) -> dict[str, Any] | None:
        """The row form of how the method got its chunks: ``{"hops": [...], **trace}`` (or the trace alone, for a
        method without rounds); None when the method records nothing."""
        if self.hops:
            return {"hops": [dict(h) for h in self.hops], **(self.trace or {})}
        return self.trace

    def to_row(self) -> dict[str, Any]:
        """The method's fields of a ``predictions.jsonl`` row (the runner adds qid, gold, answers, latency).

        ``retrieved``/``scores`` are the chunk ids and scores in rank order; ``answer``, ``trace`` (:meth:`trace_json`)
        and ``generation`` appear only when set; ``timing`` values are rounded to microseconds.
        """
        row: dict[str, Any] = {"retrieved": self.ids, "scores": self.scores, "llm_calls": self.llm_calls,
                               "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                               "iterations": self.iterations}
        if self.answer is not None:
            row["answer"] = self.answer
        trace = self.trace_json()
        if trace is not None:
            row["trace"] = trace
        if self.generation is not None:
            row["generation"] = self.generation
        row.update(self.extra)
        if self.timing is not None:
            row["timing"] = {k: round(v, 6) for k, v in self.timing.items()}
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Result:
        """The result a ``predictions.jsonl`` row was written from (:meth:`to_row`, plus the runner's question
        fields, which are not the method's): ``Result.from_row(r.to_row()).to_row() == r.to_row()``.

        A row keeps chunk ids and scores, not texts: the chunks come back with empty titles and texts. Every
        committed row is in this one schema (``tests/evaluation/test_golden_predictions.py`` reads them all back).
        """
        missing = [k for k in ("retrieved", "scores") if k not in row]
        if missing:
            raise ValueError(f"not a predictions row: no {', '.join(missing)} (qid {row.get('qid')!r})")
        if len(row["retrieved"]) != len(row["scores"]):
            raise ValueError(f"predictions row {row.get('qid')!r}: {len(row['retrieved'])} retrieved ids but "
                             f"{len(row['scores'])} scores")
        hops, trace = _split_trace(row.get("trace"))
        generation = row.get("generation")
        extra = {k: v for k, v in row.items() if k not in _ROW_FIELDS}
        return cls(question=row.get("question", ""),
                   chunks=[Chunk(id=str(i), title="", text="", score=float(s))
                           for i, s in zip(row["retrieved"], row["scores"])],
                   answer=row.get("answer"), trace=trace, iterations=row.get("iterations", 1),
                   llm_calls=row.get("llm_calls", 0), prompt_tokens=row.get("prompt_tokens", 0),
                   completion_tokens=row.get("completion_tokens", 0), timing=row.get("timing"), extra=extra,
                   hops=hops, generation=generation)

    def to_json(self, include_trace: bool = True) -> dict[str, Any]:
        """The HTTP form (``effrag serve``): the question, full chunks (with ``kept_text``), the other
        row fields under ``info``, and the trace (:meth:`trace_json`) unless left out."""
        info = {k: v for k, v in self.to_row().items() if k not in ("retrieved", "scores", "trace")}
        out: dict[str, Any] = {"question": self.question,
                               "chunks": [{**c.to_json(), "kept_text": c.kept_text} for c in self.chunks],
                               "info": info}
        if include_trace:
            out["trace"] = self.trace_json()
        return out


# the fields of a predictions row that are not a method's extra fields
_ROW_FIELDS = {"qid", "dataset", "question", "gold", "answers", "latency_s", "retrieved", "scores", "llm_calls",
               "prompt_tokens", "completion_tokens", "iterations", "answer", "trace", "generation", "timing"}


def _split_trace(trace: Any) -> tuple[list, Any]:
    """``(hops, rest)`` of a trace given as a list of rounds, a row's ``{"hops": [...], ...}`` or a method's own
    record (a dict without rounds, or None)."""
    if isinstance(trace, list):
        return list(trace), None
    if isinstance(trace, dict) and "hops" in trace:
        rest = {k: v for k, v in trace.items() if k != "hops"}
        return list(trace["hops"]), rest or None
    return [], trace
