"""Direct and Chain-of-Thought prompting: the LLM answers from its own knowledge, no retrieval.

EfficientRAG's no-retrieval baselines (Appendix B.3, Tables 9, 10, 12, 13): a
few-shot prompt per dataset asking for ``{"answer": ...}`` (Direct) or
``{"thought": ..., "answer": ...}`` (CoT) in JSON. An answer that is not in a
complete JSON object is still read (unterminated JSON, ``Answer:`` line, ``So the
answer is X`` in the thought, else the first line) and counted in
``parse_failures``.

Registered as ``direct`` (the papers' name; ``direct-llm`` is kept as an alias) and ``cot``; retrieval + one
LLM call is ``direct-r``.
"""
from __future__ import annotations

from typing import Any

from effrag.prompts import load_prompt

from .answers import parse_answer
from .base import register_pipeline
from .llm_common import LLMMethod, add_llm_args
from .result import Result


class _NoRetrieval(LLMMethod):
    retrieves = False
    prompt_set = "direct"

    def __init__(self, retriever=None, k: int = 5, llm: Any = "default", dataset: str | None = None,
                 n_examples: int | None = None, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        self.n_examples = n_examples
        self.prompts = load_prompt(f"methods/{self.prompt_set}")

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--n-examples", type=int, default=None, help="few-shot examples (default: all)")

    def build_prompt(self, question: str) -> str:
        p = self.prompts
        return "\n\n".join([p.text("instruction", self.dataset),
                            p.render_examples(self.dataset, self.n_examples),
                            p.fill("query", question=question)])

    def run(self, question: str) -> Result:
        s = self.session(question)
        text = s.ask(self.build_prompt(question))
        answer, ok = parse_answer(text)
        return s.result([], answer, iterations=1, parse_failures=0 if ok else 1, trace={"generation": text})


@register_pipeline("direct", aliases=("direct-llm",))
class DirectPrompting(_NoRetrieval):
    """Direct prompting (Table 9)."""

    prompt_set = "direct"


@register_pipeline("cot")
class CoTPrompting(_NoRetrieval):
    """Chain-of-Thought prompting (Tables 10, 12, 13); thoughts need room, hence 256 tokens."""

    prompt_set = "cot"
    default_max_tokens = 256
