"""Decompose-R: one-shot LLM decomposition, retrieval per sub-question, one answer call.

The LLM splits the question into single-hop questions with EfficientRAG's
decomposition prompt (Appendix B.3, Table 11; JSON ``decomposed_questions``).
Each sub-question retrieves ``k`` chunks. Their union is taken rank by rank
(every sub-question's top hit first, first occurrence kept), so ``max_chunks``
(what fits the LLM's context) drops the lowest-ranked chunks rather than a
whole sub-question's. The chunks go with the original question to the shared
retrieval-QA generator (Tables 14-16, :mod:`.generation`), the answer step
Direct-R and EfficientRAG use. An unparsable decomposition (the question itself
is then the only query) and a non-JSON answer each count in ``parse_failures``.
"""
from __future__ import annotations

from typing import Any

from effrag.llm import JSONParseError, parse_json_loose
from effrag.prompts import load_prompt

from .answers import parse_answer
from .base import register_pipeline
from .generation import Generator
from .llm_common import LLMMethod, add_llm_args
from .result import Result


def parse_decomposition(text: str, max_questions: int = 6) -> list[str] | None:
    """Sub-questions from the decomposition generation, or None when it has no usable list."""
    try:
        obj = parse_json_loose(text or "")
    except JSONParseError:
        return None
    subs = obj.get("decomposed_questions") if isinstance(obj, dict) else None
    if not isinstance(subs, list):
        return None
    out = []
    for s in subs:
        s = (s.get("sub_question") or s.get("question") or "") if isinstance(s, dict) else str(s)
        s = " ".join(s.split())
        if s and s not in out:
            out.append(s)
    return out[:max_questions] or None


@register_pipeline("decompose-r")
class DecomposeR(LLMMethod):
    default_max_tokens = 160

    def __init__(self, retriever, k: int = 5, llm: Any = "default", dataset: str | None = None,
                 answer_max_tokens: int = 64, max_sub_questions: int = 6, max_chunks: int = 15, **kw: Any):
        super().__init__(retriever, k=k, llm=llm, dataset=dataset, **kw)
        self.prompts = load_prompt("methods/decompose")
        self.max_sub_questions, self.max_chunks = max_sub_questions, max_chunks
        self.generator = Generator(self.llm, dataset=self.dataset, max_tokens=answer_max_tokens)

    @classmethod
    def add_args(cls, parser) -> None:
        add_llm_args(parser)
        parser.add_argument("--answer-max-tokens", type=int, default=64, help="cap of the answer call")
        parser.add_argument("--max-sub-questions", type=int, default=6)
        parser.add_argument("--max-chunks", type=int, default=15, help="chunks given to the answer call")

    def build_prompt(self, question: str) -> str:
        p = self.prompts
        return "\n\n".join([p.text("instruction"), p.render_examples(self.dataset),
                            p.fill("query", question=question)])

    def run(self, question: str) -> Result:
        s = self.session(question)
        raw = s.ask(self.build_prompt(question))
        subs = parse_decomposition(raw, self.max_sub_questions)
        failures = 0 if subs else 1
        queries = subs or [question]
        results = self.search(queries, session=s)
        seen, chunks = set(), []
        for rank in range(self.k):
            for hs in results:
                if rank < len(hs) and hs[rank].id not in seen and len(chunks) < self.max_chunks:
                    seen.add(hs[rank].id)
                    chunks.append(hs[rank])
        gen = self.generator.generate(question, chunks, self.dataset)
        s.record(gen)
        failures += 0 if parse_answer(gen.raw)[1] else 1  # stated in the JSON form the QA prompt asks for?
        return s.result(chunks, gen.answer, iterations=1, parse_failures=failures,
                        trace={"decomposition": raw, "sub_questions": queries, "answer_raw": gen.raw})
