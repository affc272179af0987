"""Hybrid retrieval by reciprocal-rank fusion (RRF) of several retrievers.

RRF (Cormack et al., 2009) scores a passage ``sum_r 1 / (k_rrf + rank_r)`` over
the retrievers that returned it (ranks from 1). It needs no score calibration
between BM25 and cosine similarities, which is why it is the usual default.
"""
from __future__ import annotations

from pathlib import Path

from .base import Hit
from .meta import files_under, write_meta


def rrf_fuse(rankings: list[list[Hit]], k: int, k_rrf: int = 60) -> list[Hit]:
    """Fuse ranked lists of one query; ties keep the order of first appearance."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for hits in rankings:
        for rank, h in enumerate(hits, start=1):
            scores[h.id] = scores.get(h.id, 0.0) + 1.0 / (k_rrf + rank)
            first.setdefault(h.id, h)
    order = sorted(scores, key=lambda pid: -scores[pid])  # stable sort keeps first-appearance ties
    return [Hit(id=pid, title=first[pid].title, text=first[pid].text, score=scores[pid]) for pid in order[:k]]


class HybridRetriever:
    """RRF over ``retrievers``, each asked for ``max(depth, k)`` hits (``depth`` defaults to k)."""

    kind = "hybrid"

    def __init__(self, retrievers: list, k_rrf: int = 60, depth: int | None = None):
        if not retrievers:
            raise ValueError("a hybrid retriever needs at least one retriever")
        self.retrievers, self.k_rrf, self.depth = list(retrievers), k_rrf, depth
        self.opts = {"k_rrf": k_rrf, "depth": depth, "parts": [getattr(r, "kind", type(r).__name__)
                                                                for r in self.retrievers]}

    @property
    def corpus(self):
        return self.retrievers[0].corpus

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        depth = max(self.depth or k, k)
        per_retriever = [r.search(queries, depth) for r in self.retrievers]
        return [rrf_fuse([res[qi] for res in per_retriever], k, self.k_rrf) for qi in range(len(queries))]

    def save(self, directory: str | Path, write_corpus: bool = True) -> Path:
        d = Path(directory)
        for i, r in enumerate(self.retrievers):
            r.save(d / f"part{i}", write_corpus=False)
        encoder = next((r.encoder for r in self.retrievers if hasattr(r, "encoder")), None)
        parts = [f for i in range(len(self.retrievers)) for f in files_under(d, f"part{i}")]
        write_meta(d, self.kind, self.corpus, self.opts, encoder=encoder, write_corpus=write_corpus, files=parts)
        return d
