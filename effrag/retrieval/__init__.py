"""Retrievers: dense (FAISS over encoder embeddings, or a Milvus collection), BM25 (bm25s) and their RRF hybrid.

Everything here speaks the :class:`~effrag.retrieval.base.Retriever` protocol,
``search(queries, k) -> list[list[Hit]]``. Use :func:`build_retriever` for a new
index, ``retriever.save(dir)`` / :func:`load_retriever` to keep one, and
:func:`cached_retriever` to get one from a fingerprint-keyed cache.
"""
from .base import Hit, Retriever
from .bm25 import BM25Retriever
from .dense import DenseRetriever, encode_corpus
from .encoder import Encoder, default_encoder_path
from .faiss_index import INDEX_TYPES, build_faiss_index
from .function import FunctionRetriever
from .hybrid import HybridRetriever, rrf_fuse
from .index import KINDS, build_retriever, cached_retriever, load_retriever
from .meta import IndexMismatchError, package_versions
from .shards import ShardedEmbeddings, encode_shards, encode_to_store, init_distributed, merge_shards

__all__ = [
    "Hit", "Retriever", "Encoder", "default_encoder_path", "DenseRetriever", "BM25Retriever",
    "HybridRetriever", "rrf_fuse", "encode_corpus", "build_retriever", "load_retriever",
    "cached_retriever", "IndexMismatchError", "KINDS", "package_versions", "INDEX_TYPES", "build_faiss_index",
    "ShardedEmbeddings", "encode_shards", "encode_to_store", "init_distributed", "merge_shards", "FunctionRetriever",
]


def __getattr__(name):  # MilvusRetriever without importing pymilvus up front
    if name == "MilvusRetriever":
        from .milvus import MilvusRetriever

        return MilvusRetriever
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
