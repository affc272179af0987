"""Building, saving, loading and caching retrievers.

A saved index is a folder with the index files, ``corpus.jsonl`` and
``index_meta.json`` (kind, corpus and encoder fingerprints, options, package
versions, and the size and sha256 of every file). ``index_meta.json`` is written
last, so a folder without it is an unfinished build. Loading with a corpus or
encoder other than the ones the index was built from raises
:class:`IndexMismatchError` instead of silently returning wrong passages, and a
file that changed since it was saved raises :class:`~effrag.integrity.IntegrityError`
(checked cheaply by default, fully with ``verify="full"`` or ``EFFRAG_VERIFY=full``;
see :mod:`effrag.integrity` and :func:`verify_index`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from .meta import META, IndexMismatchError, read_meta, verify_index  # noqa: F401  (verify_index: re-exported)

log = logging.getLogger(__name__)

KINDS = ("dense", "bm25", "hybrid", "milvus")
_DENSE_OPTS = {"index_type", "nlist", "nprobe", "hnsw_m", "ef_construction", "ef_search", "gpu",
               "shard_gpu", "batch_size", "cache_dir", "show_progress", "pq_m", "train_size", "embeddings",
               "shard_size"}
_MILVUS_OPTS = {"uri", "collection", "token", "index_type", "nlist", "nprobe", "hnsw_m", "ef_construction",
                "ef_search", "batch_size", "cache_dir", "show_progress", "embeddings", "shard_size"}
_BM25_OPTS = {"k1", "b", "stopwords", "stemmer", "article", "show_progress"}
_HYBRID_OPTS = {"k_rrf", "depth"}


def _split_opts(kind: str, opts: dict) -> tuple[dict, dict, dict]:
    allowed = {"dense": _DENSE_OPTS, "bm25": _BM25_OPTS, "hybrid": _DENSE_OPTS | _BM25_OPTS | _HYBRID_OPTS,
               "milvus": _MILVUS_OPTS}[kind]
    unknown = set(opts) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) for a {kind} retriever: {', '.join(sorted(unknown))}")
    pick = lambda keys: {k: v for k, v in opts.items() if k in keys}  # noqa: E731
    return pick(_DENSE_OPTS), pick(_BM25_OPTS), pick(_HYBRID_OPTS)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown retriever {kind!r}; expected one of {', '.join(KINDS)}")


def build_retriever(kind: str, corpus, encoder=None, encoder_path: str | None = None, bf16: bool = False, **opts):
    """A new ``dense``, ``bm25``, ``hybrid`` (dense + bm25, RRF) or ``milvus`` retriever over ``corpus``.

    ``encoder`` is an :class:`Encoder`, or a folder or alias (``"e5-small"``: with its prefixes and pooling)
    to make one from; otherwise one is made from ``encoder_path`` (default all-MiniLM-L6-v2) with ``bf16``.
    Other options go to the retriever classes (e.g. ``index_type``, ``k1``, ``k_rrf``; ``uri``/``collection`` for milvus);
    unknown ones are an error.
    """
    from .bm25 import BM25Retriever
    from .dense import DenseRetriever
    from .encoder import Encoder
    from .hybrid import HybridRetriever

    _check_kind(kind)
    dense_o, bm25_o, hybrid_o = _split_opts(kind, opts)
    if kind == "bm25":
        return BM25Retriever(corpus, **bm25_o)
    if isinstance(encoder, (str, Path)):
        encoder, encoder_path = None, encoder
    encoder = encoder or Encoder(encoder_path, bf16=bf16)
    if kind == "milvus":
        return _build_milvus(corpus, encoder, **opts)
    dense = DenseRetriever(corpus, encoder, **dense_o)
    if kind == "dense":
        return dense
    return HybridRetriever([dense, BM25Retriever(corpus, **bm25_o)], **hybrid_o)


def _build_milvus(corpus, encoder, *, uri, embeddings=None, cache_dir=None, shard_size: int = 1024,
                  batch_size: int = 64, show_progress: bool = True, **opts):
    """Encode (resumably, into ``cache_dir`` shards) unless ``embeddings`` are given, then fill Milvus."""
    from .dense import encode_corpus
    from .milvus import MilvusRetriever

    if embeddings is None:
        embeddings = encode_corpus(encoder, corpus.passages, cache_dir, shard_size=shard_size, batch_size=batch_size,
                                   show_progress=show_progress, corpus_fingerprint=corpus.fingerprint())
    return MilvusRetriever.build(corpus, encoder, uri, embeddings, show_progress=show_progress,
                                 batch_size=batch_size, **opts)


def _encoder_for(meta: dict, directory: Path, encoder_path: str | None, bf16: bool):
    """The encoder a saved dense index asks for, at ``encoder_path`` or where it was built."""
    from .encoder import Encoder, default_encoder_path

    settings = dict(meta["encoder"]["settings"])
    path = encoder_path or settings.pop("path")
    settings.pop("path", None)
    if encoder_path is None and not Path(path).is_dir():
        log.warning("%s: encoder folder %s is gone; trying the default encoder", directory, path)
        path = default_encoder_path()
    return Encoder(path, bf16=bf16, **settings)


def load_retriever(directory: str | Path, corpus=None, encoder_path: str | None = None, encoder=None,
                   bf16: bool = False, verify: str | None = None, **runtime):
    """Load a saved retriever; ``corpus``/``encoder`` given must be the ones it was built with.

    ``verify``: how much of the saved files to check against their recorded hashes first,
    ``"cheap"`` (default, or ``$EFFRAG_VERIFY``), ``"full"`` or ``"off"`` (see :mod:`effrag.integrity`).
    ``runtime`` options change search only (``nprobe``, ``ef_search``, ``gpu``, ``batch_size``; ``mmap`` for
    BM25; ``uri``/``token`` to reach a Milvus collection elsewhere).
    """
    from effrag.data import Corpus

    from .bm25 import BM25Retriever
    from .dense import DenseRetriever
    from .hybrid import HybridRetriever

    d = Path(directory)
    meta = read_meta(d)
    verify_index(d, meta, verify)  # a hybrid index's record covers its parts' files too
    saved_fp = meta["corpus"]["fingerprint"]
    if corpus is None:
        corpus = Corpus.from_jsonl(d / "corpus.jsonl")
    if corpus.fingerprint() != saved_fp:
        raise IndexMismatchError(
            f"{d}: index was built from a different corpus (fingerprint {saved_fp}, {meta['corpus']['size']} "
            f"passages) than the one given (fingerprint {corpus.fingerprint()}, {len(corpus)} passages); "
            "rebuild the index for this corpus")
    if "encoder" in meta and encoder is None:
        encoder = _encoder_for(meta, d, encoder_path, bf16)
    kind = meta["kind"]
    if kind == "bm25":
        return BM25Retriever.load(d, corpus, verify="off", mmap=bool(runtime.get("mmap", False)))
    if kind == "milvus":
        from .milvus import MilvusRetriever

        return MilvusRetriever.load(d, corpus, encoder, verify="off", **runtime)
    if kind == "dense":
        return DenseRetriever.load(d, corpus, encoder, verify="off", **runtime)
    if kind == "hybrid":
        parts = []
        for i, part_kind in enumerate(meta["options"]["parts"]):
            part = d / f"part{i}"
            parts.append(DenseRetriever.load(part, corpus, encoder, verify="off", **runtime) if part_kind == "dense"
                         else BM25Retriever.load(part, corpus, verify="off"))
        return HybridRetriever(parts, k_rrf=meta["options"]["k_rrf"], depth=meta["options"]["depth"])
    raise ValueError(f"{d}: unknown retriever kind {kind!r} in {META}")


def cache_key(kind: str, corpus, encoder=None, **opts) -> str:
    """Folder name of a cached index: kind + corpus fingerprint + encoder fingerprint + option hash."""
    relevant = {k: v for k, v in sorted(opts.items()) if k not in ("show_progress", "cache_dir", "gpu",
                                                                    "shard_gpu", "batch_size", "embeddings",
                                                                    "token", "mmap", "shard_size")}
    if encoder is not None and kind != "bm25":
        relevant["bf16"] = encoder.bf16  # bf16 embeddings differ slightly: keep them apart
    opt_hash = hashlib.sha1(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:8]
    enc = encoder.fingerprint() if encoder is not None and kind != "bm25" else "none"
    return f"{kind}-{corpus.fingerprint()}-{enc}-{opt_hash}"


def cached_retriever(kind: str, corpus, cache_root: str | Path, encoder_path: str | None = None,
                     bf16: bool = False, **opts):
    """Load the index for (kind, corpus, encoder, options) from ``cache_root``, building it on a miss.

    Dense embeddings are written in shards under the cache folder while building,
    so a killed build resumes; the shards are removed once the index is saved.
    """
    from .encoder import Encoder

    _check_kind(kind)
    encoder = Encoder(encoder_path, bf16=bf16) if kind != "bm25" else None
    d = Path(cache_root) / cache_key(kind, corpus, encoder, **opts)
    if (d / META).is_file():
        log.info("using cached index %s", d)
        runtime = {k: v for k, v in opts.items() if k in ("nprobe", "ef_search", "gpu", "shard_gpu", "batch_size",
                                                          "token")}
        return load_retriever(d, corpus=corpus, encoder=encoder, **runtime)
    if kind == "hybrid":  # its dense part is the dense index of the same corpus and encoder: built (or loaded) once
        from .bm25 import BM25Retriever
        from .hybrid import HybridRetriever

        dense_o, bm25_o, hybrid_o = _split_opts(kind, opts)
        dense = cached_retriever("dense", corpus, cache_root, encoder_path=encoder_path, bf16=bf16, **dense_o)
        retriever = HybridRetriever([dense, BM25Retriever(corpus, **bm25_o)], **hybrid_o)
        retriever.save(d)
        return retriever
    shards = d / "emb_shards"
    if kind != "bm25":
        opts = {**opts, "cache_dir": shards}
    if kind == "milvus" and "uri" not in opts:
        opts["uri"] = str(d / "milvus.db")  # Milvus Lite inside the cache folder
    retriever = build_retriever(kind, corpus, encoder=encoder, **opts)
    retriever.save(d)
    shutil.rmtree(shards, ignore_errors=True)
    return retriever
