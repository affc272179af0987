"""Answer generation over retrieved chunks with the EfficientRAG paper's retrieval QA prompts.

One :class:`Generator` is shared by EfficientRAG and Direct-R (and any other
retrieve-then-read method), so end-to-end QA differences come from the chunks
alone: same prompt (Tables 14-16 of the paper, ``effrag/prompts/qa/``), same
LLM call, same answer extraction (:func:`.answers.parse_answer`, JSON form).
:class:`ReaderGenerator` answers the same way without an LLM, with a trained extractive reader.
:func:`answer_results` applies any pipeline's ``generator`` hook to its results.
:func:`judge_answer` is the paper's LLM-judged accuracy (Table 7).
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from effrag.llm import LLM, JSONParseError, load_llm, parse_json_loose
from effrag.prompts import fill, load_prompt
from effrag.text import join_words

from .answers import parse_answer
from .result import Result

#: dataset name -> prompt file (``effrag/prompts/qa/<name>.txt``); other datasets use ``qa/default``.
DATASET_PROMPTS = {"hotpotqa": "qa/hotpotqa", "musique": "qa/musique", "2wikimqa": "qa/2wikimqa"}
DEFAULT_PROMPT = "qa/default"
JUDGE_PROMPT = "qa/judge"
CONTEXT_MODES = ("chunks", "kept_words")


def prompt_name(dataset: str | None) -> str:
    return DATASET_PROMPTS.get((dataset or "").lower(), DEFAULT_PROMPT)


def _field(chunk: Any, name: str, default: Any = None) -> Any:
    if isinstance(chunk, dict):
        return chunk.get(name, default)
    return getattr(chunk, name, default)


def chunk_context(chunk: Any, context: str = "chunks") -> str:
    """A chunk's text as a reader sees it: whole, or only the words the Labeler kept
    (``context="kept_words"``, EfficientRAG's compression; falls back to the whole text when none)."""
    if context not in CONTEXT_MODES:
        raise ValueError(f"context must be one of {CONTEXT_MODES}, got {context!r}")
    kept = _field(chunk, "kept_words") if context == "kept_words" else None
    return join_words(list(kept)) if kept else (_field(chunk, "text", "") or "")


def format_knowledge(chunks: Sequence[Any], context: str = "chunks", with_titles: bool = True) -> str:
    """The ``{knowledge}`` block: one chunk per line, ``"<title>: <text>"``.

    ``context="kept_words"`` passes only the words the Labeler kept of each chunk
    (EfficientRAG's context compression); chunks without ``kept_words`` (or with
    none kept) fall back to their full text so no retrieved evidence is dropped silently.
    """
    lines = []
    for c in chunks:
        text = chunk_context(c, context)
        title = _field(c, "title", "") or ""
        lines.append(f"{title}: {text}" if with_titles and title else text)
    return "\n".join(lines)


@dataclass
class Generation:
    """One answer: the parsed short answer, the raw text and the LLM cost of getting it."""

    answer: str
    raw: str
    prompt: str
    llm_calls: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"answer": self.answer, "raw": self.raw, "llm_calls": self.llm_calls,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_s": self.latency_s}

    def to_hook(self) -> dict[str, Any]:
        """The reply of a pipeline's ``generator`` hook (see :func:`answer_results`)."""
        return {**{k: v for k, v in self.to_json().items() if k != "raw"}, "trace": {"raw": self.raw}}


@dataclass
class Generator:
    """Retrieval-augmented answering with one LLM call per question.

    ``llm`` is an :class:`effrag.llm.LLM` or a spec string for :func:`effrag.llm.load_llm`.
    ``dataset`` picks the paper prompt (Tables 14-16); ``template`` overrides it with
    any text holding ``{knowledge}`` and ``{question}``. ``max_chunks`` caps how many
    chunks (in the order given) enter the prompt.
    """

    llm: Any
    dataset: str | None = None
    context: str = "chunks"
    with_titles: bool = True
    max_chunks: int | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    template: str | None = None
    _llm: LLM | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.context not in CONTEXT_MODES:
            raise ValueError(f"context must be one of {CONTEXT_MODES}, got {self.context!r}")
        if self.template is not None and "{question}" not in self.template:
            raise ValueError("a custom QA template must contain {question} (and usually {knowledge})")

    @property
    def model(self) -> LLM:
        if self._llm is None:
            self._llm = load_llm(self.llm) if isinstance(self.llm, str) else self.llm
        return self._llm

    def build_prompt(self, question: str, chunks: Sequence[Any], dataset: str | None = None) -> str:
        name = prompt_name(dataset or self.dataset)
        template = self.template or load_prompt(name)
        chunks = list(chunks)[: self.max_chunks] if self.max_chunks is not None else list(chunks)
        knowledge = format_knowledge(chunks, self.context, self.with_titles)
        # the paper's prompts (and users' templates) hold literal braces: only these two fields are filled
        return fill(template, "QA template" if self.template else name, strict=False, knowledge=knowledge,
                    question=question)

    def __call__(self, question: str, chunks: Sequence[Any]) -> dict[str, Any]:
        """The pipelines' ``generator(question, chunks)`` hook (Direct-R, EfficientRAG)."""
        return self.generate(question, chunks).to_hook()

    def generate(self, question: str, chunks: Sequence[Any], dataset: str | None = None) -> Generation:
        return self.generate_batch([question], [chunks], [dataset])[0]

    def generate_batch(self, questions: Sequence[str], chunks_per_question: Sequence[Sequence[Any]],
                       datasets: Sequence[str | None] | None = None) -> list[Generation]:
        """One LLM call per question (sent through ``chat_many``, concurrent where the backend allows)."""
        if len(questions) != len(chunks_per_question):
            raise ValueError(f"{len(questions)} questions but {len(chunks_per_question)} chunk lists")
        datasets = list(datasets) if datasets is not None else [None] * len(questions)
        prompts = [self.build_prompt(q, c, d) for q, c, d in zip(questions, chunks_per_question, datasets)]
        t0 = time.perf_counter()
        outs = self.model.chat_many([[{"role": "user", "content": p}] for p in prompts],
                                    temperature=self.temperature, max_tokens=self.max_tokens)
        per_q = (time.perf_counter() - t0) / max(1, len(prompts))
        result = []
        for prompt, comps in zip(prompts, outs):
            c = comps[0]
            result.append(Generation(answer=parse_answer(c.text, sentences=False)[0], raw=c.text, prompt=prompt,
                                     prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                                     latency_s=c.latency if c.latency else per_q))
        return result


class ReaderGenerator:
    """A trained extractive reader as the answer ``generator`` of any retrieve-then-read method (no LLM).

    ``ReaderGenerator(dir)(question, chunks)`` reads the ranked chunks packed into windows of the
    reader's length (``together=True``; ``False`` reads each chunk alone) and answers from the most
    confident window (:meth:`effrag.models.ExtractiveReader.read`): a span, or yes/no. With
    ``context="kept_words"`` it reads EfficientRAG's kept words instead of whole chunks. Every
    retrieval method then compares on EM/F1 with one reader and no LLM call (``effrag eval --reader DIR``).
    """

    def __init__(self, reader: Any, together: bool = True, context: str = "chunks", batch_size: int = 16):
        from effrag.models import load_reader

        if context not in CONTEXT_MODES:
            raise ValueError(f"context must be one of {CONTEXT_MODES}, got {context!r}")
        self.reader = (load_reader(reader) if not hasattr(reader, "read") else reader).eval()
        self.together, self.context, self.batch_size = together, context, batch_size

    def __call__(self, question: str, chunks: Sequence[Any]) -> dict[str, Any]:
        from effrag.text import reader_passage

        t0 = time.perf_counter()
        passages = [reader_passage(_field(c, "title", "") or "", chunk_context(c, self.context)) for c in chunks]
        ans, window = self.reader.read(question, passages, self.together, self.batch_size)
        return {"answer": ans.answer, "llm_calls": 0, "latency_s": time.perf_counter() - t0,
                "trace": {"reader": "extractive", "together": self.together, "context": self.context,
                          "window": [_field(chunks[i], "id") for i in window],
                          "confidence": round(ans.confidence, 4), "answer_type": ans.answer_type}}


def answer_results(generator: Any, results: list[Result]) -> list[dict[str, Any]]:
    """Answer every result's question from its chunks with a retrieve-then-read pipeline's ``generator``.

    ``generator`` is a :class:`Generator` (one batched ``generate_batch`` call) or any
    ``fn(question, chunks) -> str | dict``; a dict holds ``answer`` and optionally ``llm_calls``
    (default 1), ``prompt_tokens``, ``completion_tokens``, ``trace``, ``latency_s`` (e.g. IRRR's
    LLM-free reader, which reports ``llm_calls: 0``). Sets each result's ``answer`` and adds the LLM
    usage; returns the replies as dicts, whose ``trace`` and ``latency_s`` the pipeline files where
    its own trace and timing keep them. No generator: nothing is answered and the replies are empty.
    """
    if generator is None:
        return [{} for _ in results]
    if hasattr(generator, "generate_batch"):
        replies: list[Any] = [g.to_hook() for g in generator.generate_batch([r.question for r in results],
                                                                          [r.chunks for r in results])]
    else:
        replies = [generator(r.question, r.chunks) for r in results]
    replies = [{"answer": g} if isinstance(g, str) else dict(g) for g in replies]
    for r, g in zip(results, replies):
        r.answer = g.get("answer")
        r.add_usage(g.get("llm_calls", 1), g.get("prompt_tokens", 0), g.get("completion_tokens", 0))
    return replies


def parse_judgement(text: str) -> bool:
    """True when a judge generation says yes (``{"response": "yes"}`` or a bare yes)."""
    try:
        val = str(parse_json_loose(text).get("response", "")).strip().lower()
    except JSONParseError:
        m = re.search(r"""["']?response["']?\s*:\s*["']?(yes|no)""", text, re.I)
        val = m.group(1).lower() if m else text.strip().lower()
    return val.startswith("yes")


def judge_answer(llm: LLM | str, question: str, prediction: str, answers: Sequence[str] | str,
                 max_tokens: int = 16) -> tuple[bool, Generation]:
    """LLM-judged correctness with the paper's Table 7 prompt; returns (correct, the judge's generation)."""
    model = load_llm(llm) if isinstance(llm, str) else llm
    answer = answers if isinstance(answers, str) else " / ".join(answers)
    prompt = fill(load_prompt(JUDGE_PROMPT), JUDGE_PROMPT, strict=False, question=question, prediction=prediction,
                  answer=answer)
    c = model.chat([{"role": "user", "content": prompt}], temperature=0.0, max_tokens=max_tokens)[0]
    gen = Generation(answer="yes" if parse_judgement(c.text) else "no", raw=c.text, prompt=prompt,
                     prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, latency_s=c.latency)
    return gen.answer == "yes", gen
