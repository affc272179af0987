"""EfficientRAG (paper §3.1, Figure 3): the LLM-free loop, its options, its candidate pool, its systems and the
registered pipeline, one module each.

- :mod:`.config`: every loop option, declared once as an :class:`EfficientRAGConfig` field with its rule and help
  (the ``effrag eval`` flags, the HTTP request schema and ``docs/loop_options.md`` are read off the fields);
- :mod:`.state`: :class:`LoopState`, what the loop knows of one question when it ends (the pool's input);
- :mod:`.loop`: :class:`EfficientRAGLoop`, the hops (retrieve, label, rank, filter, record);
- :mod:`.models`: the Labeler, Filter and ranker checkpoints loaded for inference, and their int8 copies;
- :mod:`.pool`: :func:`rank_pool`, which chunks a question gets and in which order (options that act after the loop);
- :mod:`.system`: a trained system folder or shipped name (``labeler/``, ``filter/``, ``ranker/``, ``loop*.json``);
- :mod:`.pipeline`: the registered ``efficientrag`` method, which is also the public ``effrag.EfficientRAG``.
"""
from .config import (
                     CONTINUE,
                     DEDUP_MODES,
                     POOL_OPTIONS,
                     POOL_ORDERS,
                     POOL_SOURCES,
                     QUERY_MODES,
                     RANK_QUERIES,
                     TERMINATE,
                     EfficientRAGConfig,
                     build_config,
)
from .loop import EfficientRAGLoop
from .models import int8_copy, load_models
from .pool import rank_pool
from .state import LoopState, logit

__all__ = ["CONTINUE", "DEDUP_MODES", "POOL_OPTIONS", "POOL_ORDERS", "POOL_SOURCES", "QUERY_MODES", "RANK_QUERIES",
           "TERMINATE", "EfficientRAGConfig", "EfficientRAGLoop", "LoopState", "build_config", "int8_copy",
           "load_models", "logit", "rank_pool"]
