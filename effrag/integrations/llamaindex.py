"""effrag as a LlamaIndex retriever (``pip install 'effrag[llamaindex]'``).

    from llama_index.core.query_engine import RetrieverQueryEngine
    from effrag.integrations.llamaindex import EffragLlamaIndexRetriever
    retriever = EffragLlamaIndexRetriever.from_effrag(rag, top_k=8)
    engine = RetrieverQueryEngine.from_args(retriever, llm=my_llm)

Each result is a ``NodeWithScore`` whose ``TextNode`` has the passage id as
``id_`` and metadata ``id``, ``title``, ``score``, ``hop``, ``kept_words``,
``rank``, ``query``; only ``title`` is shown to the LLM and the embedder.
"""
from __future__ import annotations

import asyncio
from typing import Any

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"the LlamaIndex adapter needs llama-index-core: pip install 'effrag[llamaindex]' ({e})") from e

from effrag.pipelines.result import Result

from . import _check_mode, as_source, chunk_content, chunk_metadata

__all__ = ["EffragLlamaIndexRetriever", "to_nodes"]

_HIDDEN = ["id", "score", "hop", "kept_words", "rank", "query"]  # bookkeeping, not prompt text


def to_nodes(result: Result, content: str = "text") -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=c.id, text=chunk_content(c, content), metadata=chunk_metadata(c, rank),
                                        excluded_llm_metadata_keys=list(_HIDDEN),
                                        excluded_embed_metadata_keys=list(_HIDDEN)),
                          score=c.score)
            for rank, c in enumerate(result.chunks)]


class EffragLlamaIndexRetriever(BaseRetriever):
    """A LlamaIndex ``BaseRetriever`` over any effrag source (see :class:`effrag.integrations.ChunkSource`)."""

    def __init__(self, source: Any, *, top_k: int | None = None, content: str = "text",
                 options: dict[str, Any] | None = None, k: int = 10,
                 callback_manager: CallbackManager | None = None, verbose: bool = False):
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.source = as_source(source, k=k)
        self.top_k, self.content, self.options = top_k, _check_mode(content), dict(options or {})
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def from_effrag(cls, obj: Any, **kwargs: Any) -> EffragLlamaIndexRetriever:
        """Wrap an EfficientRAG, a pipeline, a retriever with ``search`` or a ``fn(queries, k)``."""
        return cls(obj, **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.source.retrieve(query_bundle.query_str, top_k=self.top_k, **self.options)
        return to_nodes(result, self.content)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
