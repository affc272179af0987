"""Direct-R: one retrieval of the top-k passages for the question itself.

The single-shot baseline of the EfficientRAG paper. With a ``generator`` it also
answers from the retrieved passages (Direct-R + LLM); without one it is
retrieval only.
"""
from __future__ import annotations

from typing import Any, Callable

from .base import Pipeline, register_pipeline

# ``generator(question, hits) -> str | dict``: a dict holds ``answer`` and optionally
# ``llm_calls`` (default 1), ``prompt_tokens``, ``completion_tokens``, ``trace``.
Generator = Callable[[str, list], "str | dict[str, Any]"]


@register_pipeline("direct-r")
class DirectR(Pipeline):
    """Top-``k`` passages for the question, in one batched ``search`` call per batch."""

    slice_k = True

    def __init__(self, retriever, k: int = 10, generator: Generator | None = None):
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        self.retriever, self.k, self.generator = retriever, k, generator
        # Rankings at smaller k are prefixes of this one; answers are not, so no slicing then.
        self.slice_k = generator is None

    def run(self, question: str) -> dict[str, Any]:
        return self.run_batch([question])[0]

    def run_batch(self, questions: list[str]) -> list[dict[str, Any]]:
        results = self.retriever.search(list(questions), self.k)
        gens = self._generate(list(questions), results)
        return [self._finish(hits, gen) for hits, gen in zip(results, gens)]

    def _generate(self, questions: list[str], results: list[list]) -> list:
        if self.generator is None:
            return [None] * len(questions)
        if hasattr(self.generator, "generate_batch"):  # effrag.pipelines.generation.Generator: one batched call
            return [g.to_hook() for g in self.generator.generate_batch(questions, results)]
        return [self.generator(q, hits) for q, hits in zip(questions, results)]

    def _finish(self, hits: list, gen) -> dict[str, Any]:
        ids, scores = [h.id for h in hits], [h.score for h in hits]
        if gen is None:
            return self.output(ids, scores)
        gen = {"answer": gen} if isinstance(gen, str) else dict(gen)
        return self.output(ids, scores, gen["answer"], llm_calls=gen.get("llm_calls", 1),
                           prompt_tokens=gen.get("prompt_tokens", 0),
                           completion_tokens=gen.get("completion_tokens", 0), trace=gen.get("trace"))
