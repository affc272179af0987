"""effrag: trainable small-model multi-hop retrieval (EfficientRAG, IRRR) and LLM-based peers in one harness."""
__version__ = "0.1.0"
