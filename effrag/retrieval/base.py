"""The one retrieval interface every method in effrag talks to.

Anything with ``search(queries: list[str], k: int) -> list[list[Hit]]`` is a
retriever: the FAISS and BM25 indexes here, a hybrid of the two, or a user's own
search service. Pipelines never look behind this method.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class Hit:
    id: str
    title: str
    text: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query, best first."""
        ...
