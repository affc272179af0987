"""Dense retrieval: encoder embeddings in a FAISS inner-product index.

Corpus embeddings are computed in shards saved as ``.npy`` files under a cache
folder, so an interrupted build (a killed job, a closed laptop) continues from
the last finished shard instead of starting over.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np

from .base import Hit
from .encoder import Encoder
from ..integrity import CorruptFileError, short_error
from .meta import REBUILD, IndexMismatchError, read_meta, verify_index, write_meta

log = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "ivf", "hnsw")


def encode_corpus(encoder: Encoder, passages: list, cache_dir: str | Path | None = None, *,
                  shard_size: int = 1024, batch_size: int = 64, show_progress: bool = True,
                  corpus_fingerprint: str = "") -> np.ndarray:
    """Embeddings of ``passages`` (float32), resumable through shards in ``cache_dir``.

    Shards of a different corpus or encoder (told apart by ``shards.json``) are
    discarded rather than mixed in.
    """
    from tqdm.auto import tqdm

    if cache_dir is None:
        return encoder.encode_passages(passages, batch_size, show_progress)
    cache = Path(cache_dir)
    key = {"corpus": corpus_fingerprint, "n": len(passages), "encoder": encoder.fingerprint(),
           "shard_size": shard_size}
    meta = cache / "shards.json"
    if meta.is_file() and json.loads(meta.read_text()) != key:
        log.info("discarding embedding shards of another corpus/encoder in %s", cache)
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps(key))
    n_shards = max(1, math.ceil(len(passages) / shard_size))
    parts = []
    bar = tqdm(total=len(passages), desc="encoding corpus", unit="passage", disable=not show_progress)
    for i in range(n_shards):
        chunk = passages[i * shard_size:(i + 1) * shard_size]
        path = cache / f"emb_{i:05d}.npy"
        if path.is_file():
            emb = np.load(path)
            bar.update(len(chunk))
        else:
            emb = encoder.encode_passages(chunk, batch_size, progress=bar)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, emb)
            tmp.replace(path)  # atomic: a half-written shard is never taken as finished
        parts.append(emb)
    bar.close()
    return np.concatenate(parts, axis=0).astype(np.float32, copy=False)


def _build_faiss(emb: np.ndarray, index_type: str, nlist: int | None, hnsw_m: int, ef_construction: int):
    import faiss

    d = emb.shape[1]
    if index_type == "flat":
        index = faiss.IndexFlatIP(d)
    elif index_type == "ivf":
        # FAISS wants >= 39 training points per list; 4*sqrt(n) is the usual rule of thumb.
        nlist = nlist or max(1, min(int(4 * math.sqrt(len(emb))), len(emb) // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(emb)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    else:
        raise ValueError(f"unknown index type {index_type!r}; expected one of {', '.join(INDEX_TYPES)}")
    index.add(emb)
    return index


def _to_gpu(index, shard: bool):
    """Move to all GPUs when FAISS sees any; otherwise (or if that fails) keep the CPU index."""
    import faiss

    try:
        if faiss.get_num_gpus() <= 0 or not hasattr(faiss, "index_cpu_to_all_gpus"):
            return index, False
        co = faiss.GpuMultipleClonerOptions()
        co.shard = shard
        return faiss.index_cpu_to_all_gpus(index, co=co), True
    except Exception as e:  # a GPU build without a usable device: stay on CPU
        log.warning("FAISS GPU unavailable (%s); using the CPU index", e)
        return index, False


class DenseRetriever:
    """FAISS inner-product search over encoder embeddings (cosine when the encoder normalises).

    ``index_type``: ``flat`` (exact, default), ``ivf`` (``nlist`` lists trained on the
    corpus, ``nprobe`` searched) or ``hnsw`` (graph, ``hnsw_m`` links, ``ef_search``).
    ``gpu``: ``"auto"`` uses every GPU FAISS sees, ``shard_gpu`` splits the index over them.
    """

    kind = "dense"

    def __init__(self, corpus, encoder: Encoder, index_type: str = "flat", *, nlist: int | None = None,
                 nprobe: int = 16, hnsw_m: int = 32, ef_construction: int = 200, ef_search: int = 128,
                 gpu: str | bool = "auto", shard_gpu: bool = False, batch_size: int = 64,
                 cache_dir: str | Path | None = None, show_progress: bool = True, _index=None):
        if index_type not in INDEX_TYPES:
            raise ValueError(f"unknown index type {index_type!r}; expected one of {', '.join(INDEX_TYPES)}")
        self.corpus, self.encoder = corpus, encoder
        self._passages = corpus.passages
        self.index_type, self.batch_size = index_type, batch_size
        self.opts = {"index_type": index_type, "nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m,
                     "ef_construction": ef_construction, "ef_search": ef_search}
        if _index is None:
            emb = encode_corpus(encoder, self._passages, cache_dir, batch_size=batch_size,
                                show_progress=show_progress, corpus_fingerprint=corpus.fingerprint())
            _index = _build_faiss(emb, index_type, nlist, hnsw_m, ef_construction)
        self._cpu_index = _index
        self._tune(_index)
        self.on_gpu = False
        if gpu:
            self._index, self.on_gpu = _to_gpu(_index, shard_gpu)
        else:
            self._index = _index

    def _tune(self, index) -> None:
        if self.index_type == "ivf":
            index.nprobe = self.opts["nprobe"]
        elif self.index_type == "hnsw":
            index.hnsw.efSearch = self.opts["ef_search"]

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
        faiss.write_index(self._cpu_index, str(d / "index.faiss"))
        write_meta(d, self.kind, self.corpus, self.opts, encoder=self.encoder, write_corpus=write_corpus,
                   files=["index.faiss"])
        return d

    @classmethod
    def load(cls, directory: str | Path, corpus, encoder: Encoder, verify: str | None = None,
             **runtime) -> "DenseRetriever":
        """Load a saved index; ``verify`` (``"cheap"``/``"full"``/``"off"``) checks its files first."""
        import faiss

        d = Path(directory)
        meta = read_meta(d)
        verify_index(d, meta, verify)
        if meta["encoder"]["fingerprint"] != encoder.fingerprint():
            raise IndexMismatchError(
                f"{d}: index was built with encoder {meta['encoder']['settings']['path']} "
                f"(fingerprint {meta['encoder']['fingerprint']}), but encoder {encoder.path} "
                f"has fingerprint {encoder.fingerprint()} (different weights, config, pooling or prefixes)")
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
        keep = ("nlist", "nprobe", "hnsw_m", "ef_construction", "ef_search")
        return cls(corpus, encoder, opts["index_type"], **{k: opts[k] for k in keep if k in opts},
                   gpu=runtime.get("gpu", "auto"), shard_gpu=runtime.get("shard_gpu", False),
                   batch_size=runtime.get("batch_size", 64), _index=index)
