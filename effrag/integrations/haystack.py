"""effrag as a Haystack retriever component (``pip install 'effrag[haystack]'``).

    from haystack import Pipeline
    from effrag.integrations.haystack import EffragHaystackRetriever
    p = Pipeline()
    p.add_component("retriever", EffragHaystackRetriever(rag, top_k=8))
    p.add_component("prompt", PromptBuilder(template=...))
    p.connect("retriever.documents", "prompt.documents")

``run(query, top_k=None)`` returns ``{"documents": [...], "trace": ...}``: Haystack
Documents with the passage id as ``id``, the retrieval score as ``score`` and meta
``id``, ``title``, ``score``, ``hop``, ``kept_words``, ``rank``, ``query``; ``trace``
is the method's per-hop record (EfficientRAG: queries, tags, kept words).
"""
from __future__ import annotations

import asyncio
from typing import Any

try:
    from haystack import Document, component
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"the Haystack adapter needs haystack-ai: pip install 'effrag[haystack]' ({e})") from e

from . import Retrieval, _check_mode, as_source, chunk_content, chunk_metadata

__all__ = ["EffragHaystackRetriever", "to_haystack_documents"]


def to_haystack_documents(result: Retrieval, content: str = "text") -> list[Document]:
    return [Document(id=c.id, content=chunk_content(c, content), meta=chunk_metadata(c, rank), score=c.score)
            for rank, c in enumerate(result.chunks)]


@component
class EffragHaystackRetriever:
    """A Haystack component over any effrag source (see :class:`effrag.integrations.ChunkSource`)."""

    def __init__(self, source: Any, top_k: int | None = None, content: str = "text",
                 options: dict[str, Any] | None = None, k: int = 10, corpus: Any = None):
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.source = as_source(source, k=k, corpus=corpus)
        self.top_k, self.content, self.options = top_k, _check_mode(content), dict(options or {})

    @component.output_types(documents=list[Document], trace=Any)
    def run(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        result = self.source.retrieve(query, top_k=top_k or self.top_k, **self.options)
        return {"documents": to_haystack_documents(result, self.content), "trace": result.trace}

    @component.output_types(documents=list[Document], trace=Any)
    async def run_async(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.run, query, top_k)
