"""effrag as a LangChain retriever (``pip install 'effrag[langchain]'``).

    from effrag.integrations.langchain import EffragLangChainRetriever
    retriever = EffragLangChainRetriever.from_effrag(rag, top_k=8)   # EfficientRAG, pipeline or retriever
    chain = retriever | format_docs | prompt | llm                    # any LCEL chain

Each :class:`~langchain_core.documents.Document` holds the passage (or
``content="kept_words"``: only the words the Labeler kept) and metadata ``id``,
``title``, ``score``, ``hop``, ``kept_words``, ``rank``, ``query``.
"""
from __future__ import annotations

import asyncio
from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, Field, field_validator
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"the LangChain adapter needs langchain-core: pip install 'effrag[langchain]' ({e})") from e

from . import CONTENT_MODES, ChunkSource, Retrieval, as_source, chunk_content, chunk_metadata

__all__ = ["EffragLangChainRetriever", "to_documents"]


def to_documents(result: Retrieval, content: str = "text") -> list[Document]:
    return [Document(page_content=chunk_content(c, content), metadata=chunk_metadata(c, rank), id=c.id)
            for rank, c in enumerate(result.chunks)]


class EffragLangChainRetriever(BaseRetriever):
    """A LangChain ``BaseRetriever`` over any effrag source (see :class:`effrag.integrations.ChunkSource`).

    ``options`` are EfficientRAG loop settings applied to every call (e.g.
    ``{"tag_threshold": 0.3}``); ``invoke(query, top_k=3)`` overrides ``top_k`` per call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: ChunkSource
    top_k: int | None = Field(default=None, ge=1)
    content: str = "text"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("source", mode="before")
    @classmethod
    def _wrap_source(cls, v: Any) -> ChunkSource:
        return as_source(v)

    @field_validator("content")
    @classmethod
    def _check_content(cls, v: str) -> str:
        if v not in CONTENT_MODES:
            raise ValueError(f"content must be one of {CONTENT_MODES}, got {v!r}")
        return v

    @classmethod
    def from_effrag(cls, obj: Any, *, k: int = 10, corpus: Any = None, **kwargs: Any) -> "EffragLangChainRetriever":
        """Wrap an EfficientRAG, a pipeline, a retriever with ``search`` or a ``fn(queries, k)``."""
        return cls(source=as_source(obj, k=k, corpus=corpus), **kwargs)

    def _retrieve(self, query: str, top_k: int | None) -> list[Document]:
        result = self.source.retrieve(query, top_k=top_k or self.top_k, **self.options)
        return to_documents(result, self.content)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                top_k: int | None = None) -> list[Document]:
        return self._retrieve(query, top_k)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       top_k: int | None = None) -> list[Document]:
        # The models run in a worker thread so the event loop stays free.
        return await asyncio.to_thread(self._retrieve, query, top_k)
