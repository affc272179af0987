"""Streaming, resumable, data-parallel corpus encoding into ``.npy`` shards on disk.

A *store* is a folder::

    shards.json       what the shards are embeddings of: corpus and encoder fingerprints, size, shard size
    emb_00000.npy     shard i = the embeddings of passages[i * shard_size : (i + 1) * shard_size]
    ...
    embeddings.npy    every shard merged in corpus order (written by :func:`merge_shards`; read memory-mapped)

Each shard is written to a temporary name and renamed, so a killed encode never leaves a
half-written shard that looks finished, and the next run encodes only the shards that are missing.
Memory stays flat as the corpus grows: one shard is in memory at a time, and the merged file is
written shard by shard into a memory map and read back memory-mapped.

Data-parallel encoding: under ``accelerate launch`` or ``torchrun`` (``WORLD_SIZE`` > 1) every process
encodes the shards ``i`` with ``i % world_size == rank`` and process 0 merges them after a barrier
(:func:`init_distributed` joins the process group: gloo on CPU, NCCL on GPUs). A shard is always
encoded whole by one process, so 1, 2 or N processes write the same bytes.
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from ..integrity import writing
from ..state_files import atomic_open, atomic_path, read_json, write_text_atomic

log = logging.getLogger(__name__)

KEY_FILE = "shards.json"
MERGED = "embeddings.npy"


def shard_key(encoder, n: int, shard_size: int, corpus_fingerprint: str = "") -> dict:
    """What a store's shards are embeddings of; shards under another key are discarded, never mixed in."""
    return {"corpus": corpus_fingerprint, "n": n, "encoder": encoder.fingerprint(), "shard_size": shard_size}


def shard_path(store: str | Path, i: int) -> Path:
    return Path(store) / f"emb_{i:05d}.npy"


# ---------------------------------------------------------------------------- processes
def dist_info() -> tuple[int, int]:
    """(rank, world size) of the initialised torch.distributed group, else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> tuple[int, int]:
    """Join the process group that ``accelerate launch`` / ``torchrun`` describe in the environment.

    One process (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) starts nothing. Backend: NCCL when CUDA is
    available, else gloo. Returns (rank, world size).
    """
    if dist_info()[1] > 1 or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return dist_info()
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


# ---------------------------------------------------------------------------- encoding
def _shard_rows(path: Path) -> int | None:
    try:
        return int(np.load(path, mmap_mode="r", allow_pickle=False).shape[0])
    except (OSError, ValueError, EOFError):
        return None


def _merged_ok(store: Path, n: int) -> bool:
    return (store / MERGED).is_file() and _shard_rows(store / MERGED) == n


def _read_key(meta: Path):
    """The store's key; None when it does not read back (torn by a kill of an older effrag): another store's."""
    try:
        return json.loads(meta.read_text())
    except (OSError, ValueError):
        return None


def _prepare(store: Path, key: dict, rank: int, world: int) -> None:
    """Process 0 discards a store of another corpus/encoder and writes the key; then everyone checks it."""
    meta = store / KEY_FILE
    if rank == 0:
        if store.is_dir() and (not meta.is_file() or _read_key(meta) != key) and any(store.iterdir()):
            log.info("discarding embedding shards of another corpus/encoder in %s", store)
            for f in [*store.glob("emb_*.npy"), *store.glob("embeddings*.npy"), *store.glob("*.npy.tmp*"), meta]:
                f.unlink(missing_ok=True)  # only the store's own files: never a folder the user pointed at
        store.mkdir(parents=True, exist_ok=True)
        write_text_atomic(meta, json.dumps(key))
    _barrier(world)
    if read_json(meta, "remove the folder to encode again") != key:
        raise RuntimeError(f"{store}: process {rank} disagrees with process 0 on the corpus/encoder being encoded")


def encode_shards(encoder, passages: list, store: str | Path, *, shard_size: int = 1024, batch_size: int = 64,
                  corpus_fingerprint: str = "", rank: int | None = None, world_size: int | None = None,
                  show_progress: bool = True) -> dict:
    """Encode this process's missing shards of ``passages`` into ``store``; finished ones are kept.

    ``rank``/``world_size`` default to the torch.distributed group (see :func:`init_distributed`);
    process ``rank`` takes the shards ``i % world_size == rank``. All processes return after every
    shard is on disk. Returns ``{"n_shards", "encoded": [i...], "reused": [i...]}`` for this process.
    """
    from tqdm.auto import tqdm

    if rank is None or world_size is None:
        rank, world_size = dist_info()
    store = Path(store)
    n = len(passages)
    n_shards = max(1, math.ceil(n / shard_size))
    _prepare(store, shard_key(encoder, n, shard_size, corpus_fingerprint), rank, world_size)
    stats = {"n_shards": n_shards, "encoded": [], "reused": []}
    mine = list(range(rank, n_shards, world_size))
    if _merged_ok(store, n):
        stats["reused"] = mine
        _barrier(world_size)
        return stats
    todo_rows = sum(len(passages[i * shard_size:(i + 1) * shard_size]) for i in mine)
    bar = tqdm(total=todo_rows, desc=f"encoding corpus (rank {rank}/{world_size})" if world_size > 1
               else "encoding corpus", unit="passage", disable=not show_progress or rank != 0)
    for i in mine:
        chunk = passages[i * shard_size:(i + 1) * shard_size]
        path = shard_path(store, i)
        if _shard_rows(path) == len(chunk):
            stats["reused"].append(i)
            bar.update(len(chunk))
            continue
        emb = encoder.encode_passages(chunk, batch_size, progress=bar).astype(np.float32, copy=False)
        with writing(path), atomic_open(path, "wb") as f:  # a half-written shard is never taken as finished
            np.save(f, emb)
        stats["encoded"].append(i)
    bar.close()
    _barrier(world_size)
    return stats


def merge_shards(store: str | Path, *, keep_shards: bool = False) -> Path:
    """Write ``embeddings.npy`` from the finished shards (streaming, flat memory); return its path.

    The shards are removed afterwards unless ``keep_shards``; a store already merged is left as is.
    """
    store = Path(store)
    key = read_json(store / KEY_FILE, "remove the folder to encode again")
    n, size = key["n"], key["shard_size"]
    out = store / MERGED
    if _merged_ok(store, n):
        return out
    n_shards = max(1, math.ceil(n / size))
    missing = [i for i in range(n_shards) if not shard_path(store, i).is_file()]
    if missing:
        raise FileNotFoundError(f"{store}: {len(missing)} of {n_shards} shards not encoded yet "
                                f"(first: {shard_path(store, missing[0]).name}); run the encode again to finish")
    dim = int(np.load(shard_path(store, 0), mmap_mode="r", allow_pickle=False).shape[1])
    with atomic_path(out) as tmp:
        merged = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for i in range(n_shards):
            part = np.load(shard_path(store, i), mmap_mode="r", allow_pickle=False)
            if part.shape[0] != min(size, n - i * size) or part.shape[1] != dim:
                raise ValueError(f"{shard_path(store, i)}: shape {part.shape} does not fit a store of {n} x {dim}")
            merged[i * size:i * size + part.shape[0]] = part
        merged.flush()
        del merged
    if not keep_shards:
        for i in range(n_shards):
            shard_path(store, i).unlink(missing_ok=True)
    return out


class ShardedEmbeddings:
    """The embeddings of a store as one read-only ``(n, dim)`` array, memory-mapped shard by shard.

    Supports ``len``, ``shape``, slices and (sorted) row arrays: what FAISS training, batched adds and
    Milvus inserts need, without ever concatenating the corpus in memory. ``np.asarray`` of it does
    concatenate (small corpora, tests).
    """

    def __init__(self, store: str | Path):
        store = Path(store)
        key = read_json(store / KEY_FILE, "remove the folder to encode again")
        self.store, self.n, self.shard_size = store, int(key["n"]), int(key["shard_size"])
        if _merged_ok(store, self.n):
            self._parts = [np.load(store / MERGED, mmap_mode="r", allow_pickle=False)]
            self.shard_size = max(1, self.n)
        else:
            n_shards = max(1, math.ceil(self.n / self.shard_size))
            missing = [i for i in range(n_shards) if _shard_rows(shard_path(store, i)) is None]
            if missing:
                raise FileNotFoundError(f"{store}: {len(missing)} of {n_shards} shards not encoded yet (first: "
                                        f"{shard_path(store, missing[0]).name}); run the encode again to finish")
            self._parts = [np.load(shard_path(store, i), mmap_mode="r", allow_pickle=False) for i in range(n_shards)]
        self.dim = int(self._parts[0].shape[1])
        self.dtype = np.dtype(np.float32)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.dim)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item) -> np.ndarray:
        if isinstance(item, slice):
            start, stop, step = item.indices(self.n)
            if step != 1:
                return self[np.arange(start, stop, step)]
            out = [p[max(0, start - i * self.shard_size):max(0, stop - i * self.shard_size)]
                   for i, p in enumerate(self._parts)
                   if i * self.shard_size < stop and (i + 1) * self.shard_size > start]
            return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
        rows = np.asarray(item)
        if rows.ndim == 0:
            return self._parts[int(rows) // self.shard_size][int(rows) % self.shard_size]
        return np.stack([self._parts[r // self.shard_size][r % self.shard_size] for r in rows.tolist()]) \
            if len(rows) else np.zeros((0, self.dim), np.float32)

    def __array__(self, dtype=None, copy=None):
        arr = self[0:self.n]
        return arr.astype(dtype) if dtype is not None else arr


def load_embeddings(store: str | Path) -> ShardedEmbeddings:
    """The embeddings of a finished store, memory-mapped (its merged file, or its shards)."""
    return ShardedEmbeddings(store)


def encode_to_store(encoder, passages: list, store: str | Path, *, shard_size: int = 1024, batch_size: int = 64,
                    corpus_fingerprint: str = "", show_progress: bool = True) -> ShardedEmbeddings:
    """Encode ``passages`` into ``store`` (resumably, over every process of the group); their embeddings.

    Every process gets the finished store (memory-mapped), once all processes are done.
    """
    rank, world = dist_info()
    encode_shards(encoder, passages, store, shard_size=shard_size, batch_size=batch_size,
                  corpus_fingerprint=corpus_fingerprint, rank=rank, world_size=world, show_progress=show_progress)
    return ShardedEmbeddings(store)
