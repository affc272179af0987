"""Direct-R: one retrieval of the top-k passages for the question itself.

The single-shot baseline of the EfficientRAG paper. With a ``generator`` it also
answers from the retrieved passages (Direct-R + LLM); without one it is
retrieval only.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Pipeline, register_pipeline
from .generation import answer_results
from .result import Chunk, Result

# ``generator(question, chunks) -> str | dict``: see :func:`.generation.answer_results`.
Generator = Callable[[str, list], "str | dict[str, Any]"]


@register_pipeline("direct-r")
class DirectR(Pipeline):
    """Top-``k`` passages for the question, in one batched ``search`` call per batch."""

    slice_k = True
    uses_generator = True

    def __init__(self, retriever, k: int = 10, generator: Generator | None = None):
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        self.retriever, self.k, self.generator = retriever, k, generator
        # Rankings at smaller k are prefixes of this one; answers are not, so no slicing then.
        self.slice_k = generator is None

    def run(self, question: str) -> Result:
        return self.run_batch([question])[0]

    def run_batch(self, questions: list[str]) -> list[Result]:
        hits = self.retriever.search(list(questions), self.k)
        results = [Result(q, [Chunk.from_hit(h, query=q) for h in hs]) for q, hs in zip(questions, hits)]
        for r, reply in zip(results, answer_results(self.generator, results)):
            r.generation = reply.get("trace")
        return results
