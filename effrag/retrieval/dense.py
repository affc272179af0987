"""Dense retrieval: encoder embeddings in a FAISS inner-product index.

Corpus embeddings are computed in shards saved as ``.npy`` files under a cache
folder, so an interrupted build (a killed job, a closed laptop) continues from
the last finished shard instead of starting over.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..integrity import CorruptFileError, short_error, writing
from .base import Hit
from .encoder import Encoder
from .faiss_index import INDEX_TYPES, build_faiss_index, set_search_params, to_gpus
from .meta import REBUILD, IndexMismatchError, read_meta, verify_index, write_meta
from .shards import encode_to_store

log = logging.getLogger(__name__)


def encode_corpus(encoder: Encoder, passages: list, cache_dir: str | Path | None = None, *,
                  shard_size: int = 1024, batch_size: int = 64, show_progress: bool = True,
                  corpus_fingerprint: str = ""):
    """Embeddings of ``passages`` (float32), resumable through shards in ``cache_dir``.

    Without ``cache_dir`` an in-memory array; with it, the shards of :mod:`.shards` (encoded by
    every process of a torch.distributed group, if one is running), memory-mapped. Shards of a
    different corpus or encoder (told apart by ``shards.json``) are discarded rather than mixed in.
    """
    if cache_dir is None:
        return encoder.encode_passages(passages, batch_size, show_progress)
    return encode_to_store(encoder, passages, cache_dir, shard_size=shard_size, batch_size=batch_size,
                           corpus_fingerprint=corpus_fingerprint, show_progress=show_progress)


class DenseRetriever:
    """FAISS inner-product search over encoder embeddings (cosine when the encoder normalises).

    ``index_type``: ``flat`` (exact, default), ``ivf`` (``nlist`` lists trained on a sample of
    ``train_size`` rows, ``nprobe`` searched), ``ivfpq`` (the same with ``pq_m``-byte product-quantised
    vectors) or ``hnsw`` (graph, ``hnsw_m`` links, ``ef_search``); see :mod:`.faiss_index`.
    ``embeddings``: the corpus's embeddings already computed (an array or a
    :class:`~.shards.ShardedEmbeddings`, e.g. from ``effrag index encode``) instead of encoding here.
    ``gpu``: ``"auto"`` uses every GPU FAISS sees, ``shard_gpu`` splits the index over them.
    """

    kind = "dense"

    def __init__(self, corpus, encoder: Encoder, index_type: str = "flat", *, nlist: int | None = None,
                 nprobe: int = 16, hnsw_m: int = 32, ef_construction: int = 200, ef_search: int = 128,
                 pq_m: int | None = None, train_size: int | None = None,
                 gpu: str | bool = "auto", shard_gpu: bool = False, batch_size: int = 64,
                 cache_dir: str | Path | None = None, shard_size: int = 1024, show_progress: bool = True,
                 embeddings=None, _index=None):
        if index_type not in INDEX_TYPES:
            raise ValueError(f"unknown index type {index_type!r}; expected one of {', '.join(INDEX_TYPES)}")
        self.corpus, self.encoder = corpus, encoder
        self._passages = corpus.passages
        self.index_type, self.batch_size = index_type, batch_size
        self.opts = {"index_type": index_type, "nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m,
                     "ef_construction": ef_construction, "ef_search": ef_search}
        if index_type == "ivfpq" or pq_m is not None:
            self.opts["pq_m"] = pq_m
        if train_size is not None:
            self.opts["train_size"] = train_size
        if _index is None:
            emb = embeddings if embeddings is not None else encode_corpus(
                encoder, self._passages, cache_dir, shard_size=shard_size, batch_size=batch_size,
                show_progress=show_progress, corpus_fingerprint=corpus.fingerprint())
            if len(emb) != len(self._passages):
                raise ValueError(f"{len(emb)} embeddings for a corpus of {len(self._passages)} passages")
            _index = build_faiss_index(emb, index_type, nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m,
                                       ef_construction=ef_construction, train_size=train_size)
        self._cpu_index = _index
        self._tune(_index)
        self.on_gpu = False
        if gpu:
            self._index, self.on_gpu = to_gpus(_index, shard_gpu)
            if self.on_gpu:
                self._tune(self._index)
        else:
            self._index = _index

    def _tune(self, index) -> None:
        set_search_params(index, self.index_type, nprobe=self.opts["nprobe"], ef_search=self.opts["ef_search"])

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if not queries:
            return []
        q = self.encoder.encode_queries(list(queries), self.batch_size)
        scores, rows = self._index.search(q, min(k, len(self._passages)))
        out = []
        for srow, irow in zip(scores, rows):
            hits = []
            for s, i in zip(srow, irow):
                if i < 0:  # FAISS pads with -1 when an approximate index finds fewer than k
                    continue
                p = self._passages[i]
                hits.append(Hit(id=p.id, title=p.title, text=p.text, score=float(s)))
            out.append(hits)
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path, write_corpus: bool = True) -> Path:
        import faiss

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        with writing(d / "index.faiss"):
            faiss.write_index(self._cpu_index, str(d / "index.faiss"))
        write_meta(d, self.kind, self.corpus, self.opts, encoder=self.encoder, write_corpus=write_corpus,
                   files=["index.faiss"])
        return d

    @classmethod
    def load(cls, directory: str | Path, corpus, encoder: Encoder, verify: str | None = None,
             **runtime) -> DenseRetriever:
        """Load a saved index; ``verify`` (``"cheap"``/``"full"``/``"off"``) checks its files first."""
        import faiss

        d = Path(directory)
        meta = read_meta(d)
        verify_index(d, meta, verify)
        if meta["encoder"]["fingerprint"] != encoder.fingerprint():
            from ..models.e5 import missing_marker

            why = missing_marker(encoder.path) or "different weights, config, pooling or prefixes"
            raise IndexMismatchError(
                f"{d}: index was built with encoder {meta['encoder']['settings']['path']} "
                f"(fingerprint {meta['encoder']['fingerprint']}), but encoder {encoder.path} "
                f"has fingerprint {encoder.fingerprint()} ({why})")
        path = d / "index.faiss"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the index folder is incomplete; {REBUILD}")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:  # FAISS reports a damaged or truncated file as a RuntimeError
            raise CorruptFileError(f"corrupted file {path} ({short_error(e)}); {REBUILD}") from None
        if index.ntotal != len(corpus):
            raise IndexMismatchError(f"{d}: index holds {index.ntotal} vectors but the corpus has {len(corpus)}")
        opts = dict(meta["options"])
        opts.update({k: v for k, v in runtime.items() if k in ("nprobe", "ef_search")})
        keep = ("nlist", "nprobe", "hnsw_m", "ef_construction", "ef_search", "pq_m", "train_size")
        return cls(corpus, encoder, opts["index_type"], **{k: opts[k] for k in keep if k in opts},
                   gpu=runtime.get("gpu", "auto"), shard_gpu=runtime.get("shard_gpu", False),
                   batch_size=runtime.get("batch_size", 64), _index=index)
