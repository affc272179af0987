"""effrag as a LangChain retriever (``pip install 'effrag[langchain]'``).

    from effrag.integrations.langchain import EffragLangChainRetriever
    retriever = EffragLangChainRetriever.from_effrag(rag, k=8)       # EfficientRAG, pipeline or retriever
    chain = retriever | format_docs | prompt | llm                    # any LCEL chain
    retriever.invoke("...", k=3)                                      # LangChain's convention: k per call

``k`` is the number of documents, in the constructor and per call, as in LangChain's own
retrievers (its standard ``RetrieversIntegrationTests`` suite runs in our tests); ``top_k`` is
accepted as an alias. An unknown constructor field is an error, not silently ignored.

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
    from pydantic import AliasChoices, ConfigDict, Field, field_validator
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"the LangChain adapter needs langchain-core: pip install 'effrag[langchain]' ({e})") from e

from effrag.pipelines.result import Result

from . import CONTENT_MODES, ChunkSource, as_source, chunk_content, chunk_metadata

__all__ = ["EffragLangChainRetriever", "to_documents"]


def to_documents(result: Result, content: str = "text") -> list[Document]:
    return [Document(page_content=chunk_content(c, content), metadata=chunk_metadata(c, rank), id=c.id)
            for rank, c in enumerate(result.chunks)]


class EffragLangChainRetriever(BaseRetriever):
    """A LangChain ``BaseRetriever`` over any effrag source (see :class:`effrag.integrations.ChunkSource`).

    ``k`` caps the documents per call (default: the source's own, e.g. the EfficientRAG pool);
    ``invoke(query, k=3)`` overrides it per call. ``options`` are EfficientRAG loop settings applied
    to every call (e.g. ``{"tag_threshold": 0.3}``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", populate_by_name=True)

    source: ChunkSource
    k: int | None = Field(default=None, ge=1, validation_alias=AliasChoices("k", "top_k"))
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
    def from_effrag(cls, obj: Any, *, k: int | None = None, **kwargs: Any) -> EffragLangChainRetriever:
        """Wrap an EfficientRAG, a pipeline, a retriever with ``search`` or a ``fn(queries, k)``; ``k`` as above."""
        return cls(source=as_source(obj, k=k or 10), k=k, **kwargs)

    def _retrieve(self, query: str, k: int | None) -> list[Document]:
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive integer, got {k!r}")
        result = self.source.retrieve(query, top_k=k or self.k, **self.options)
        return to_documents(result, self.content)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, top_k: int | None = None) -> list[Document]:
        return self._retrieve(query, k if k is not None else top_k)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, top_k: int | None = None) -> list[Document]:
        # The models run in a worker thread so the event loop stays free.
        return await asyncio.to_thread(self._retrieve, query, k if k is not None else top_k)
