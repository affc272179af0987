"""One shard file of a late ranker's chunk vectors, format 2 (:mod:`.late_vectors` keeps the store of them).

A shard is a safetensors file: ``digests`` [n, 16], ``offsets`` [n + 1], ``checks`` [n, 8] and ``payload``
[tokens, ...], with the format, the model variant and the SHA-256 of the three header tensors in its metadata. It is
read here without a safetensors reader: the file is opened once, its header parsed and bounds-checked against the
file's size, the header tensors copied and checked, and the payload left memory-mapped, a chunk's rows copied out
(and checked against the chunk's own check) when a question asks for them. Nothing is unpickled.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

FORMAT = "effrag-late-vectors/2"  # /1 (a whole-shard hash, no codec): refused, its chunks encoded again
DIGEST_BYTES = 16
CHECK_BYTES = 8


def chunk_check(digest: bytes, payload: torch.Tensor) -> bytes:
    """A chunk's check: BLAKE2b-64 of its digest and its payload's bytes (verified at each read of the chunk)."""
    return hashlib.blake2b(digest + payload.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
                           digest_size=CHECK_BYTES).digest()


def tensor_hash(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_DTYPES = {"U8": torch.uint8, "I64": torch.int64, "F32": torch.float32, "BF16": torch.bfloat16,
           "F16": torch.float16}


class Shard:
    """One shard opened for reading: its header tensors (digests, offsets, checks) in memory and checked against the
    SHA-256 recorded at write; its payload memory-mapped, a chunk's rows read (and checked) when asked for. The file
    is opened once and mapped: another process's prune or rename over the path changes nothing read here (shards
    are written whole under a temporary name and renamed, never changed in place)."""

    def __init__(self, path: Path, variant: str):
        import mmap

        self.path = path
        with open(path, "rb") as f:  # FileNotFoundError: pruned since listed (a miss)
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise Refused("truncated")
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(self.map, "madvise"):  # a question reads a few KB of scattered chunks: no read-around (which
            self.map.madvise(mmap.MADV_RANDOM)  # paged in ~0.8 MB a chunk read, 37 MB of page cache a question)
        n = int.from_bytes(self.map[:8], "little")
        if 8 + n > size:
            raise Refused("truncated")
        try:
            header = json.loads(self.map[8: 8 + n])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise Refused(f"unreadable ({str(e)[:80]})") from None
        meta = header.pop("__metadata__", None) or {}
        if meta.get("format") != FORMAT or meta.get("variant") != variant:
            raise Refused("written by another model variant or format")
        self.base = 8 + n
        self.spec: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
        for name in ("digests", "offsets", "checks", "payload"):
            t = header.get(name)
            try:
                dtype, shape, (start, end) = _DTYPES[t["dtype"]], [int(x) for x in t["shape"]], t["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise Refused(f"no readable tensor {name!r}") from None
            if not 0 <= start <= end or self.base + end > size or \
                    end - start != math.prod(shape) * torch.empty(0, dtype=dtype).element_size():
                raise Refused(f"truncated or malformed tensor {name!r}")
            self.spec[name] = (dtype, shape, int(start), int(end))
        self.digests, self.offsets, self.checks = (self._tensor(k) for k in ("digests", "offsets", "checks"))
        if meta.get("sha256") != tensor_hash(self.digests, self.offsets, self.checks):
            raise Refused("its bytes do not match the SHA-256 recorded when it was written")
        dtype, shape, _, _ = self.spec["payload"]
        nchunks = len(self.digests) if self.digests.ndim == 2 else -1
        if (self.offsets.ndim != 1 or len(self.offsets) != nchunks + 1 or int(self.offsets[0]) != 0
                or int(self.offsets[-1]) != shape[0] or bool((self.offsets[1:] < self.offsets[:-1]).any())
                or tuple(self.checks.shape) != (nchunks, CHECK_BYTES) or self.digests.shape[1] != DIGEST_BYTES):
            raise Refused("its offsets do not match its vectors")
        self.payload_dtype, self.row_shape = dtype, shape[1:]
        self.row_bytes = math.prod(self.row_shape) * torch.empty(0, dtype=dtype).element_size()
        self.bounds = self.offsets.tolist()
        self.keys = self.digests.numpy().view("<u8")[:, 0]  # the digest's first 8 bytes: the lookup key

    def _tensor(self, name: str) -> torch.Tensor:
        dtype, shape, start, end = self.spec[name]
        raw = bytearray(self.map[self.base + start: self.base + end])
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape) if raw else \
            torch.empty(shape, dtype=dtype)

    def read(self, row: int, digest: bytes) -> torch.Tensor:
        """Chunk ``row``'s payload, checked against its recorded check (a Refused when it does not match)."""
        if self.digests[row].numpy().tobytes() != digest:
            raise Refused("its digests do not match its lookup")
        _, _, start, _ = self.spec["payload"]
        a, b = self.bounds[row], self.bounds[row + 1]
        raw = bytearray(self.map[self.base + start + a * self.row_bytes: self.base + start + b * self.row_bytes])
        payload = torch.frombuffer(raw, dtype=torch.uint8).view(self.payload_dtype).reshape(b - a, *self.row_shape) \
            if raw else torch.empty(0, *self.row_shape, dtype=self.payload_dtype)
        if chunk_check(digest, payload) != self.checks[row].numpy().tobytes():
            raise Refused(f"chunk {row}'s bytes do not match the check recorded when it was written")
        return payload


class Refused(Exception):
    """A shard that fails a check: removed, and its chunks encoded again."""
