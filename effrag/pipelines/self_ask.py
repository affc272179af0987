"""Self-Ask (Press et al., 2023) with retrieval, as run in EfficientRAG (Appendix B.3, Tables 20-22).

The LLM writes ``Are follow up questions needed here: Yes.`` / ``Follow up: q`` and
generation stops before ``Intermediate answer:``. As in the EfficientRAG authors'
released code, the follow-up question retrieves ``k`` chunks and is answered by
the shared retrieval-QA generator (Tables 14-16, :mod:`.generation`); that answer
is written after ``Intermediate answer:`` and the LLM continues with the next
follow-up or ``So the final answer is: X``. A chain that stops without a final
answer (no progress, or ``max_follow_ups`` reached) gets ``So the final answer
is:`` appended for one last call; if that yields nothing, the last intermediate
answer is returned (counted in ``parse_failures``).

:func:`run_chain` is the chain machinery alone, shared with MCR's decomposition
chains (where the LLM itself writes the intermediate answers from prepended evidence).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from effrag.prompts import load_prompt

from .answers import clean_answer, parse_answer
from .base import register_pipeline
from .generation import Generator
from .llm_common import LLMMethod, add_llm_args
from .result import Result

STOP = ["\nIntermediate answer:", "\n#", "\nQuestion:"]
_PREFIXES = [
    ("needed", re.compile(r"^are follow up questions needed here\s*:?\s*(.*)$", re.I)),
    ("fu", re.compile(r"^follow[ -]?up\s*:\s*(.*)$", re.I)),
    ("ia", re.compile(r"^intermediate answer\s*:?\s*(.*)$", re.I)),
    ("final", re.compile(r"^so the final answer is\s*:?\s*(.*)$", re.I)),
    ("skip", re.compile(r"^(?:question\s*:|#|</?doc>|context\d*\s*:)", re.I)),
]


@dataclass
class Step:
    question: str
    answer: str | None = None
    hits: list = field(default_factory=list)


@dataclass
class Chain:
    """One Self-Ask chain: the needed-answer, follow-up steps, the final answer (None if never stated)."""

    needed: str = ""
    steps: list[Step] = field(default_factory=list)
    final: str | None = None
    generations: list[str] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def pending(self) -> Step | None:
        return self.steps[-1] if self.steps and self.steps[-1].answer is None else None

    def partial(self) -> str:
        """The chain text after ``Are follow up questions needed here:`` (empty before the first call)."""
        if not self.needed and not self.steps:
            return ""
        lines = [self.needed or "Yes."]
        for s in self.steps:
            lines.append(f"Follow up: {s.question}")
            lines.append(f"Intermediate answer: {s.answer}" if s.answer is not None else "Intermediate answer:")
        return " " + "\n".join(lines)

    @property
    def answer(self) -> str:
        """The final answer, else the last intermediate answer (Self-Ask's fallback), else ''."""
        if self.final:
            return self.final
        answered = [s.answer for s in self.steps if s.answer]
        return clean_answer(answered[-1]) if answered else ""

    @property
    def hits(self) -> list:
        return [h for s in self.steps for h in s.hits]


def _events(text: str, first_kind: str) -> list[tuple[str, str]]:
    """Classify the lines of a generation; leading free text belongs to ``first_kind``."""
    out: list[tuple[str, str]] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        for kind, pat in _PREFIXES:
            m = pat.match(line)
            if m:
                if kind != "skip":
                    out.append((kind, m.group(1).strip() if m.groups() else ""))
                break
        else:
            out.append((first_kind, line) if not out else ("text", line))
    return out


def _apply(chain: Chain, events: list[tuple[str, str]]) -> bool:
    """Update the chain with one generation's events; True if it made progress."""
    progress = False
    for kind, value in events:
        if kind == "needed":  # only a yes/no counts; a direct answer in prose is not the Self-Ask format
            if not chain.steps and not chain.needed and re.match(r"(yes|no)\b", value, re.I):
                chain.needed, progress = value, True
        elif kind == "ia":
            if chain.pending is not None and value:
                chain.pending.answer, progress = value, True
        elif kind == "fu":
            if chain.pending is not None:
                break  # a second question before the first got its evidence: ignore the rest
            if value and value.lower() not in {s.question.lower() for s in chain.steps}:
                chain.needed = chain.needed or "Yes."
                chain.steps.append(Step(value))
                return True  # retrieve for it before anything else
        elif kind == "final":
            if value:
                chain.final, progress = clean_answer(value), True
                return True
    return progress


def run_chain(ask: Callable[[str], str], render: Callable[[Chain], str], retrieve: Callable[[str], list],
              max_follow_ups: int = 4, answer: Callable[[str, list], str] | None = None) -> Chain:
    """Build one chain: ``render(chain)`` is the prompt, ``ask`` calls the LLM, ``retrieve(q)`` gives hits.

    With ``answer(q, hits)`` the intermediate answers come from it (Self-Ask's external answerer);
    without, the LLM writes them in its next call (MCR).
    """
    chain = Chain()
    for _ in range(2 * max_follow_ups + 2):
        first = "ia" if chain.pending is not None else ("needed" if not chain.needed and not chain.steps else "text")
        gen = ask(render(chain))
        chain.generations.append(gen)
        if not _apply(chain, _events(gen, first)):
            chain.stop_reason = "no progress"
            return chain
        if chain.final:
            chain.stop_reason = "final answer"
            return chain
        if chain.pending is not None:
            if len(chain.steps) > max_follow_ups:
                chain.steps.pop()
                chain.stop_reason = "follow-up cap"
                return chain
            step = chain.pending
            step.hits = list(retrieve(step.question))
            if answer is not None:
                step.answer = " ".join((answer(step.question, step.hits) or "unknown").split())
    chain.stop_reason = "call cap"
    return chain


@register_pipeline("self-ask")
class SelfAsk(LLMMethod):
    default_max_tokens = 96

    def __init__(self, retriever, k: int = 10, llm: Any = "default", dataset: str | None = None,
                 max_follow_ups: int = 5, answer_max_tokens: int = 64, n_examples: int | None = None, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        self.max_follow_ups, self.n_examples = max_follow_ups, n_examples
        self.prompts = load_prompt("methods/self_ask")
        self.generator = Generator(self.llm, dataset=self.dataset, max_tokens=answer_max_tokens)

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--max-follow-ups", type=int, default=5, help="step cap of the chain (authors' code: 5)")
        parser.add_argument("--answer-max-tokens", type=int, default=64, help="cap of each follow-up's QA call")
        parser.add_argument("--n-examples", type=int, default=None, help="few-shot examples (default: all)")

    def render(self, question: str, chain: Chain, suffix: str = "") -> str:
        p = self.prompts
        return "\n".join([p.text("instruction", self.dataset),
                          p.render_examples(self.dataset, self.n_examples, sep="\n"),
                          p.fill("query", question=question, partial=chain.partial() + suffix)])

    def run(self, question: str) -> Result:
        s = self.session(question)
        shown: list = []

        def answer(q: str, hits: list) -> str:
            gen = self.generator.generate(q, hits, self.dataset)
            s.record(gen)
            shown.extend(hits)
            return gen.answer

        chain = run_chain(lambda prompt: s.ask(prompt, stop=STOP), lambda c: self.render(question, c),
                          lambda q: self.search([q], session=s)[0], self.max_follow_ups, answer)
        failures, forced = 0, None
        if chain.final:
            final = chain.final
        else:  # Self-Ask's closing step: ask for the final answer outright
            forced = s.ask(self.render(question, chain, "\nSo the final answer is:"), stop=["\n"])
            final = clean_answer(forced)  # the reply is the span after "So the final answer is:"
            if not final:
                final, failures = chain.answer or parse_answer(chain.generations[-1] if chain.generations
                                                               else "", "sentence")[0], 1
        return s.result(shown, final, iterations=len(chain.steps), parse_failures=failures,
                        trace={"chain": chain.partial(), "stop_reason": chain.stop_reason,
                               "follow_ups": [st.question for st in chain.steps], "forced_final": forced})
