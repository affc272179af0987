"""The public API: EfficientRAG as a multi-hop retriever in a few lines.

    from effrag import EfficientRAG
    rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # the shipped system, its retriever
    rag = EfficientRAG.from_pretrained("checkpoints/efficientrag-all", retriever="indexes/hotpotqa-bm25")  # your own
    chunks = rag.retrieve("Who directed the film that ...?")   # a Result: reads as its chunk list
    for c in chunks:                 # ranked by hop, then p(<Continue>)
        print(c.hop, c.score, c.title, c.kept_text)
    chunks.hops                      # per hop: queries, retrieved ids, tags, kept words, next queries
    rag.answer("Who directed ...?", llm="default").answer

``EfficientRAG`` is the registered pipeline itself (:class:`effrag.pipelines.efficientrag.pipeline.
EfficientRAGPipeline`, ``effrag eval --method efficientrag``): one object behind the API, the CLI, the adapters
and ``effrag serve``. The retriever is anything with ``search(queries, k) -> list[list[Hit]]`` (the FAISS, BM25
and hybrid indexes of :mod:`effrag.retrieval`), a saved index directory, or a plain function ``fn(queries, k)``
returning hits as :class:`~effrag.retrieval.base.Hit` objects or ``{"id", "title", "text", "score"}`` dicts.
"""
from __future__ import annotations

from effrag.pipelines.efficientrag.config import EfficientRAGConfig
from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline as EfficientRAG
from effrag.pipelines.result import Chunk, Hop, Result
from effrag.retrieval.function import FunctionRetriever
from effrag.setup import as_retriever

__all__ = ["EfficientRAG", "EfficientRAGConfig", "Chunk", "Hop", "Result", "FunctionRetriever", "as_retriever"]
