"""Shared parts of the LLM-based methods (Direct, CoT, Decompose-R, Iter-RetGen, Self-Ask, IRCoT,
SearChain, MCR): per-question accounting of LLM calls and retrieval rounds, and the base class.

Prompts are data: ``effrag/prompts/methods/<method>.yaml``, loaded with
``effrag.prompts.load_prompt("methods/<method>")`` (instruction, example/query templates and
few-shot examples per dataset, ``hotpotqa``, ``2wikimqa``, ``musique``; other datasets such as
Bamboogle and StrategyQA use the file's ``fallback`` set). README.md in that folder gives each
file's source. Answers are read with :func:`.answers.parse_answer`.

Every method returns a :class:`~.result.Result` whose ``extra`` holds ``parse_failures``: how many
generations did not have the expected form and were handled the way the paper does (e.g. the
whole generation taken as the answer), and ``method_latency_s``.
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import Pipeline
from .result import Chunk, Result

PROMPT_DATASETS = ("hotpotqa", "2wikimqa", "musique")
_SENT_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def first_sentence(text: str) -> str:
    """The first sentence of a generation (IRCoT keeps one CoT sentence per reason-step)."""
    t = " ".join((text or "").split())
    if not t:
        return ""
    parts = _SENT_END.split(t, maxsplit=1)
    return parts[0].strip()


def same_answer(a: str, b: str) -> bool:
    """SearChain's consistency test for short answers: the normalised ``a`` occurs inside ``b``."""
    from effrag.text import normalize_answer

    na, nb = normalize_answer(a), normalize_answer(b)
    return bool(na) and (na in nb or (bool(nb) and nb in na and len(nb) >= 0.6 * len(na)))


# ------------------------------------------------------------------ per-question accounting

@dataclass
class Session:
    """One question's run: every LLM call through here is counted (cached calls included), and every
    retrieval round noted, so each chunk of the result knows the round (hop) and query that found it."""

    question: str
    llm: Any
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0  # retrieval rounds (``search`` calls) so far
    found: dict[str, tuple[int, str]] = field(default_factory=dict)  # chunk id -> (round, query), first seen
    started: float = field(default_factory=time.perf_counter)

    def note_retrieval(self, queries: Sequence[str], results: Sequence[Sequence[Any]]) -> None:
        for q, hits in zip(queries, results):
            for h in hits:
                self.found.setdefault(h.id, (self.rounds, q))
        self.rounds += 1

    def chat(self, messages: str | Sequence[dict[str, str]], **kw: Any) -> list:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        kw.setdefault("max_tokens", self.max_tokens)
        kw.setdefault("temperature", self.temperature)
        kw.setdefault("seed", self.seed)
        t0 = time.perf_counter()
        comps = self.llm.chat(list(messages), **kw)
        self.llm_seconds += time.perf_counter() - t0
        self.calls += 1
        self.prompt_tokens += sum(c.prompt_tokens for c in comps)
        self.completion_tokens += sum(c.completion_tokens for c in comps)
        self.log.append({"prompt_chars": sum(len(m["content"]) for m in messages),
                         "outputs": [c.text for c in comps], "temperature": kw["temperature"]})
        return comps

    def record(self, generation: Any) -> None:
        """Count a call made elsewhere (e.g. the shared :class:`~.generation.Generator`)."""
        self.calls += int(getattr(generation, "llm_calls", 1))
        self.prompt_tokens += int(getattr(generation, "prompt_tokens", 0))
        self.completion_tokens += int(getattr(generation, "completion_tokens", 0))
        self.llm_seconds += float(getattr(generation, "latency_s", 0.0))
        self.log.append({"prompt_chars": len(getattr(generation, "prompt", "")),
                         "outputs": [getattr(generation, "raw", "")], "temperature": None})

    def ask(self, prompt: str | Sequence[dict[str, str]], **kw: Any) -> str:
        return self.chat(prompt, **kw)[0].text

    def result(self, hits: Sequence, answer: str, *, iterations: int, parse_failures: int,
               trace: dict[str, Any] | None = None) -> Result:
        """The question's result: ``hits`` are all chunks given to the LLM, in order (deduplicated here,
        scored by the retriever); the trace gains the LLM call log."""
        chunks: dict[str, Chunk] = {}
        for h in hits:
            if h.id not in chunks:
                hop, query = self.found.get(h.id, (0, ""))
                chunks[h.id] = Chunk.from_hit(h, hop=hop, query=query)
        return Result(self.question, list(chunks.values()), answer, trace={**(trace or {}), "llm_log": self.log},
                      iterations=iterations, llm_calls=self.calls, prompt_tokens=self.prompt_tokens,
                      completion_tokens=self.completion_tokens,
                      extra={"parse_failures": parse_failures,
                             "method_latency_s": round(time.perf_counter() - self.started, 4)})


# ------------------------------------------------------------------ base class

def resolve_llm(llm: Any):
    """An :class:`effrag.llm.LLM` from an instance or a spec string (``default``, ``gguf:PATH``, ``openai:URL#M``)."""
    if llm is None:
        llm = "default"
    if isinstance(llm, str):
        from effrag.llm import load_llm

        return load_llm(llm)
    if not hasattr(llm, "chat"):
        raise TypeError(f"llm must be an effrag.llm.LLM or a spec string, got {type(llm).__name__}")
    return llm


def canonical_dataset(dataset: str | None) -> str | None:
    if dataset is None:
        return None
    from effrag.data.loaders import _ALIASES

    d = dataset.strip().lower()
    return _ALIASES.get(d, d)


class LLMMethod(Pipeline):
    """Base of the LLM-based methods: holds retriever, LLM, prompt dataset and generation settings.

    A method's ``run`` opens a :meth:`session` for the question, calls the LLM through it,
    retrieves with :meth:`search` (passing the session) and ends with ``session.result(...)``.
    """

    retrieves = True
    default_max_tokens = 128
    uses_llm = True
    uses_dataset = True

    def __init__(self, retriever=None, k: int = 5, llm: Any = "default", dataset: str | None = None,
                 max_tokens: int | None = None, temperature: float = 0.0, seed: int = 0,
                 prompt_dataset: str | None = None):
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if self.retrieves and retriever is None:
            raise ValueError(f"method {self.name!r} needs a retriever")
        self.retriever, self.k = retriever, k
        self.llm = resolve_llm(llm)
        # few-shot set: --prompt-dataset if given, else the questions' dataset, else each file's fallback
        self.dataset = canonical_dataset(prompt_dataset or dataset)
        self.max_tokens = max_tokens or self.default_max_tokens
        self.temperature, self.seed = temperature, seed

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)

    def run_batch(self, questions: list[str]) -> list[Result]:
        """Questions in threads when the LLM takes concurrent requests (a server; the transformers backend,
        which decodes concurrent requests as one batch), else one by one. Results in input order."""
        n = min(int(getattr(self.llm, "max_concurrency", 1) or 1), len(questions))
        if n <= 1:
            return [self.run(q) for q in questions]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"effrag-{self.name}") as pool:
            return list(pool.map(self.run, questions))

    def session(self, question: str, max_tokens: int | None = None) -> Session:
        return Session(question, self.llm, max_tokens or self.max_tokens, self.temperature, self.seed)

    def search(self, queries: list[str], k: int | None = None, session: Session | None = None) -> list[list]:
        """Top-``k`` (default: the method's) hits per query, one round noted in ``session`` when given."""
        results = self.retriever.search([q if q.strip() else "?" for q in queries], k or self.k)
        if session is not None:
            session.note_retrieval(queries, results)
        return results


def add_llm_args(parser) -> None:
    """Options shared by the LLM methods (``--llm`` only if the CLI does not define it already)."""
    have = getattr(parser, "_option_string_actions", {})
    if "--llm" not in have:
        parser.add_argument("--llm", default="default", metavar="SPEC",
                            help="LLM spec: default (SmolLM2 GGUF), gguf:PATH, hf:default|PATH[#PRECISION] or openai:URL#MODEL")
    if "--prompt-dataset" not in have:
        parser.add_argument("--prompt-dataset", default=None, choices=PROMPT_DATASETS,
                            help="whose few-shot examples to use (default: the questions' dataset if the "
                                 "caller passes it, else the prompt file's fallback set)")
    if "--max-tokens" not in have:
        parser.add_argument("--max-tokens", type=int, default=None,
                            help="generation cap per LLM call (default: the method's)")
