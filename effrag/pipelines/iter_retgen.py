"""Iter-RetGen (Shao et al., 2023) with EfficientRAG's prompts (Appendix B.3, Tables 17-19).

Iteration 1 retrieves ``k`` chunks for the question and generates a thought and
an answer; every further iteration retrieves with the question followed by the
previous generation's thought (``q || y_{t-1}``, as in the EfficientRAG authors'
released code) and generates again from the newly retrieved chunks. The last iteration's answer is returned; ``retrieved`` lists
every chunk shown to the LLM over all iterations. ``iterations`` is 2 or 3 in the
papers (option ``--iterations``).
"""
from __future__ import annotations

from typing import Any

from effrag.llm import JSONParseError, parse_json_loose
from effrag.prompts import load_prompt

from .answers import parse_answer
from .base import register_pipeline
from .generation import format_knowledge
from .llm_common import LLMMethod, add_llm_args
from .result import Result


def generation_text(raw: str) -> str:
    """The part of a generation that joins the next query: the JSON's thought (as in the authors'
    released code), else its answer, else the raw text without code fences."""
    try:
        obj = parse_json_loose(raw or "")
    except JSONParseError:
        obj = None
    if isinstance(obj, dict) and (obj.get("thought") or obj.get("answer")):
        return str(obj.get("thought") or obj.get("answer")).strip()
    return " ".join((raw or "").replace("```json", " ").replace("```", " ").split())


@register_pipeline("iter-retgen")
class IterRetGen(LLMMethod):
    default_max_tokens = 192

    def __init__(self, retriever, k: int = 10, llm: Any = "default", dataset: str | None = None,
                 iterations: int = 3, n_examples: int | None = None, max_query_words: int = 128, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.iterations, self.n_examples, self.max_query_words = iterations, n_examples, max_query_words
        self.prompts = load_prompt("methods/iter_retgen")

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--iterations", type=int, default=3, help="retrieval-generation rounds (paper: 2 or 3)")
        parser.add_argument("--n-examples", type=int, default=None, help="few-shot examples (default: all)")

    def build_prompt(self, question: str, chunks: list) -> list[dict[str, str]]:
        p = self.prompts
        return [{"role": "system", "content": p.text("system")},
                {"role": "user", "content": "\n\n".join([
                    p.text("instruction"), p.render_examples(self.dataset, self.n_examples),
                    p.fill("query", question=question, documents=format_knowledge(chunks))])}]

    def run(self, question: str) -> Result:
        s = self.session(question)
        shown, steps, answer, failures, prev = [], [], "", 0, ""
        for t in range(self.iterations):
            query = question if not prev else f"{question} {' '.join(prev.split()[:self.max_query_words])}"
            chunks = self.search([query], session=s)[0]
            shown.extend(chunks)
            raw = s.ask(self.build_prompt(question, chunks))
            answer, ok = parse_answer(raw)
            failures += 0 if ok else 1
            prev = generation_text(raw)
            steps.append({"query": query, "retrieved": [c.id for c in chunks], "generation": raw, "answer": answer})
        return s.result(shown, answer, iterations=self.iterations, parse_failures=failures, trace={"steps": steps})
