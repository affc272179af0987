"""Every folder effrag keeps between runs, in one place.

``$EFFRAG_CACHE_DIR`` (default ``~/.cache/effrag``) is the root of all of them; it has one meaning everywhere:

    indexes/            retrieval indexes built on the fly (``effrag.setup``; ``--cache-dir`` names another)
    late-vectors/       the late-interaction ranker's chunk vectors, one store per corpus and model
    backbones/          packaged encoders converted once (``e5-small``, ``smollm2``); ``$EFFRAG_BACKBONES`` moves it
    llm-models/         LLM files converted once (re-quantised GGUF, dequantised Hugging Face folders)
    llm_cache.sqlite    the LLM response cache
    encoder-hashes.json the SHA-256 of weight files that carry no record of their own, from their first use

Before 2026-11-29 ``$EFFRAG_CACHE_DIR`` named the index folder itself in ``effrag.setup`` and the root elsewhere;
an index cached under the old meaning is rebuilt once (it is a cache).
"""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "EFFRAG_CACHE_DIR"
BACKBONES_ENV = "EFFRAG_BACKBONES"
HASHES_FILE = "encoder-hashes.json"  # the name predates the LLM entries; kept so earlier records stay valid
LLM_CACHE_FILE = "llm_cache.sqlite"


def cache_root() -> Path:
    """``$EFFRAG_CACHE_DIR``, else ``~/.cache/effrag``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "effrag")


def index_cache_dir() -> Path:
    """Retrieval indexes built on the fly: ``<cache root>/indexes``."""
    return cache_root() / "indexes"


def late_vectors_dir() -> Path:
    """The late ranker's vector stores: ``<cache root>/late-vectors``."""
    return cache_root() / "late-vectors"


def backbones_dir() -> Path:
    """Packaged encoders converted once: ``$EFFRAG_BACKBONES``, else ``<cache root>/backbones``. It follows the cache
    root so that a fresh cache (a test, a clean run) uses conversions of its own, not ones another cache left."""
    return Path(os.environ[BACKBONES_ENV]) if os.environ.get(BACKBONES_ENV) else cache_root() / "backbones"


def llm_models_dir() -> Path:
    """LLM files converted once: ``<cache root>/llm-models``."""
    return cache_root() / "llm-models"


def llm_cache_file() -> Path:
    """The LLM response cache: ``<cache root>/llm_cache.sqlite``."""
    return cache_root() / LLM_CACHE_FILE


def first_use_records() -> Path:
    """The SHA-256 of each weight file that carries no record of its own, from its first use:
    ``<cache root>/encoder-hashes.json``."""
    return cache_root() / HASHES_FILE
