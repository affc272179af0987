"""FAISS indexes over (possibly memory-mapped) embeddings: flat, IVF-Flat, IVF-PQ, HNSW; GPU sharding.

Everything is inner product (cosine for the normalised encoders effrag uses). Vectors are added in
batches, so embeddings memory-mapped from disk (:mod:`.shards`) are never loaded whole; IVF
centroids and PQ codebooks are trained on a random sample of ``train_size`` rows.

==========  ============================  ==================================  =======================
type        what it stores per vector     built with                          searched with
==========  ============================  ==================================  =======================
``flat``    the vector (4 d bytes)        nothing (exact)                     nothing
``ivf``     the vector + 8-byte id        ``nlist`` k-means lists             ``nprobe`` lists
``ivfpq``   ``pq_m`` bytes + 8-byte id    ``nlist`` lists, ``pq_m`` x 8-bit PQ ``nprobe`` lists
``hnsw``    the vector + ~2 ``hnsw_m``    ``hnsw_m`` links, ``ef_construction`` ``ef_search``
            4-byte links
==========  ============================  ==================================  =======================
"""
from __future__ import annotations

import logging
import math

import numpy as np

log = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "ivf", "ivfpq", "hnsw")
ADD_BATCH = 65536


def default_nlist(n: int) -> int:
    """4 sqrt(n) lists (the usual rule of thumb), at most n / 39 (FAISS wants >= 39 training points a list)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def default_pq_m(d: int) -> int:
    """Sub-quantizers for IVF-PQ: d / 8 (48 bytes a vector for 384-d MiniLM), a divisor of ``d``."""
    for m in (d // 8, d // 4, d // 2, d):
        if m >= 1 and d % m == 0:
            return m
    return d


def train_sample(emb, size: int, seed: int = 0) -> np.ndarray:
    """``size`` rows of ``emb`` drawn without replacement (in file order, so a memory map reads forward)."""
    n = len(emb)
    if size >= n:
        return np.ascontiguousarray(emb[:], dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
    return np.ascontiguousarray(emb[rows], dtype=np.float32)


def add_in_batches(index, emb, batch: int = ADD_BATCH) -> None:
    for s in range(0, len(emb), batch):
        index.add(np.ascontiguousarray(emb[s:s + batch], dtype=np.float32))


def build_faiss_index(emb, index_type: str = "flat", *, nlist: int | None = None, pq_m: int | None = None,
                      pq_bits: int = 8, hnsw_m: int = 32, ef_construction: int = 200,
                      train_size: int | None = None, seed: int = 0):
    """A FAISS inner-product index of ``index_type`` over ``emb`` (an array or a memory map), filled.

    ``train_size`` (IVF/IVF-PQ): rows sampled for k-means and PQ training (default: 64 per list,
    at least 2^pq_bits x 39 for PQ, at most all).
    """
    import faiss

    if index_type not in INDEX_TYPES:
        raise ValueError(f"unknown index type {index_type!r}; expected one of {', '.join(INDEX_TYPES)}")
    n, d = emb.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(d)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    else:
        nlist = nlist or default_nlist(n)
        quantizer = faiss.IndexFlatIP(d)
        if index_type == "ivf":
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            need = 64 * nlist
        else:
            pq_bits = max(1, min(pq_bits, int(math.log2(max(2, n)))))  # k-means needs >= 2^bits points
            index = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m or default_pq_m(d), pq_bits,
                                     faiss.METRIC_INNER_PRODUCT)
            need = max(64 * nlist, 39 * 2 ** pq_bits)
        index.train(train_sample(emb, train_size or need, seed))
    add_in_batches(index, emb)
    return index


def set_search_params(index, index_type: str, *, nprobe: int = 16, ef_search: int = 128) -> None:
    """``nprobe`` (IVF lists searched) or ``efSearch`` (HNSW candidate list), on a CPU or GPU index."""
    import faiss

    if index_type in ("ivf", "ivfpq"):
        try:
            faiss.extract_index_ivf(index).nprobe = nprobe
        except RuntimeError:  # a GPU/sharded index: set it through the parameter space
            faiss.GpuParameterSpace().set_index_parameter(index, "nprobe", nprobe)
    elif index_type == "hnsw":
        index.hnsw.efSearch = ef_search


def to_gpus(index, shard: bool):
    """(index, on_gpu): on every GPU FAISS sees (split over them with ``shard``), else the CPU index as is."""
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
