"""effrag: trainable small-model multi-hop retrieval (EfficientRAG, IRRR) and LLM-based peers in one harness.

Public API::

    from effrag import EfficientRAG
    rag = EfficientRAG.from_pretrained("labeler/", "filter/", retriever=my_retriever)   # the registered pipeline
    chunks = rag.retrieve("Who directed the film that ...?")
"""
import os as _os

# torch's OpenMP threads spin while waiting; on a shared or small CPU that makes every
# forward pass 5-50x slower (measured here). Must be set before torch is imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["EfficientRAG", "EfficientRAGConfig", "Chunk", "Hop", "Result", "__version__"]


def __getattr__(name):  # lazy: importing effrag must not import torch
    if name in ("EfficientRAG", "EfficientRAGConfig", "Chunk", "Hop", "Result"):
        from effrag import api

        return getattr(api, name)
    raise AttributeError(f"module 'effrag' has no attribute {name!r}")
