"""A plain function as a retriever: ``fn(queries, k)`` returning hits as :class:`Hit` objects or dicts."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Hit


class FunctionRetriever:
    """Wraps ``fn(queries, k)`` into a retriever; dict hits become :class:`Hit` (errors name the bad field)."""

    def __init__(self, fn: Callable[[list[str], int], Sequence[Sequence[Any]]]):
        self.fn = fn

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results = self.fn(list(queries), k)
        if len(results) != len(queries):
            raise ValueError(f"retriever function returned {len(results)} hit lists for {len(queries)} queries")
        return [[self._hit(h, qi, r) for r, h in enumerate(hits)] for qi, hits in enumerate(results)]

    @staticmethod
    def _hit(h: Any, qi: int, rank: int) -> Hit:
        if isinstance(h, Hit):
            return h
        if isinstance(h, dict):
            missing = [f for f in ("id", "text") if f not in h]
            if missing:
                raise ValueError(f"retriever function: hit {rank} of query {qi} lacks field(s) {missing}: {h!r}")
            return Hit(id=str(h["id"]), title=str(h.get("title") or ""), text=str(h["text"]),
                       score=float(h.get("score", 0.0)))
        raise TypeError(f"retriever function: hit {rank} of query {qi} is a {type(h).__name__}, "
                        "expected Hit or dict with id/title/text/score")
