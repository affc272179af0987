"""A late-interaction ranker's chunk vectors on disk, so a corpus is encoded once, not at every opening.

Why: :meth:`~.late_ranker.LateRankerModel.index` reads every chunk of a corpus with the encoder when a system opens
it (about 85 s per 8k chunks on 2 CPU cores, and ``effrag retrieve`` opens the system at each call). The vectors
depend only on the chunk's words and on the model that read them, so they are kept in a content-addressed store:

- a folder per model variant: the weights' fingerprint, the stored dtype, the chunk length and whether the reads run
  int8 (:func:`store_folder`), under ``$EFFRAG_CACHE_DIR`` or ``~/.cache/effrag``, ``late-vectors/``;
- in it, shards of at most :data:`SHARD_CHUNKS` chunks (``vectors-<hash of their digests>.safetensors``), each written
  whole and renamed, so a killed index keeps every finished shard and the next opening encodes only the rest (two
  processes indexing at once write distinct or identical shards, never a mixed one);
- a shard holds ``digests`` [n, 16] (BLAKE2b-128 of the chunk's words joined by U+001F), ``offsets`` [n + 1],
  ``checks`` [n, 8] (BLAKE2b-64 of each chunk's digest and payload bytes) and ``payload`` [tokens, ...]: the token
  vectors as computed (bf16 or fp32), or, for a model with a codec (:mod:`.late_codec`), their product-quantised
  codes (64 bytes a token, about 6.2 KB a chunk against about 25 KB); its metadata holds the variant (the codec's
  SHA-256 included) and the SHA-256 of the three header tensors.

Reading is on demand (format 2, issue #68): opening a store reads each shard's header tensors only and checks them;
the payload stays memory-mapped, and a chunk's rows are read, and checked against its recorded check, when a
question asks for them. A million chunks cost the store about 125 MB of headers and lookup in memory (measured),
whatever their vectors' size. A shard whose checks fail (truncated, bytes changed, another variant or format, an
older store's format 1) is named in a warning and removed, nothing read from it is used, and its chunks are encoded
again: never read as if it were right. A store that cannot be written (a read-only home, a full disk) is named in
one warning, and the vectors serve the process only. After each index the whole store is kept within
``$EFFRAG_LATE_VECTORS_MAX_GB`` (default 8; 0: never pruned; read and checked when a store opens, before anything is
encoded) by removing the least recently used shards, never one the index read or wrote (:func:`prune`); the
temporary files of writes in progress count too, and those a killed writer left are removed. Another process may
prune or delete shards and folders at any moment: what vanishes is a miss (its chunks are encoded again), never an
error; a shard already opened is read from its map, the file as it was opened (shards are only ever written whole
under a new name, never changed in place). Nothing is unpickled.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..state_files import atomic_path, temp_owner
from .late_shard import CHECK_BYTES, DIGEST_BYTES, FORMAT, Refused, Shard, chunk_check, tensor_hash

SHARD_CHUNKS = 4096
MAX_GB_ENV = "EFFRAG_LATE_VECTORS_MAX_GB"  # the whole store's size cap, in GB (0: never pruned)
DEFAULT_MAX_GB = 8.0
SHARD_GLOB = "vectors-*.safetensors"
VECTORS_DIR = "late-vectors"  # an index's own store root: <index>/late-vectors (effrag index build --system)
KEEP_MARKER = "KEEP"  # in a store root: an index's own shards (effrag index build --system), never pruned
TEMP_GLOB = SHARD_GLOB + ".tmp*"  # a shard being written (effrag.state_files names it <shard>.tmp<pid>-<n>)
TEMP_GRACE_S = 60.0  # a temporary file whose writer is gone is left this long (a writer in another pid namespace)
TEMP_MAX_AGE_S = 3600.0  # ... and one untouched this long is stale whoever wrote it (a shard is written in seconds)
_log = logging.getLogger(__name__)


def chunk_digest(words: Sequence[str]) -> bytes:
    """The key of a chunk's vectors: BLAKE2b-128 of its words joined by U+001F."""
    return hashlib.blake2b("\x1f".join(words).encode("utf-8"), digest_size=DIGEST_BYTES).digest()


def shard_chunks() -> int:
    """Chunks per shard: :data:`SHARD_CHUNKS`, read at each call (a test makes shards small)."""
    return SHARD_CHUNKS


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (16 hex digits) of a model's parameters and buffers, by name, as they are in memory (an int8 copy's
    packed weights by their int8 values and scales)."""
    h = hashlib.sha256()

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value.dequantize() if value.is_quantized else value
        elif isinstance(value, (tuple, list)):
            for v in value:
                yield from tensors(v)

    for name, value in sorted(model.state_dict().items()):
        h.update(f"{name};".encode())
        for t in tensors(value):
            t = t.detach().cpu().contiguous()
            h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def model_fingerprint(model) -> str:
    """:func:`weights_fingerprint` and the tokenizer's (the same weights under another vocabulary read apart)."""
    from .tokenization import tokenizer_spec

    vocab = hashlib.sha256(tokenizer_spec(model.tokenizer).encode()).hexdigest()[:16]
    return f"{weights_fingerprint(model)}-{vocab}"


def default_root() -> Path:
    """``$EFFRAG_CACHE_DIR/late-vectors``, else ``~/.cache/effrag/late-vectors`` (:mod:`effrag.paths`)."""
    from effrag.paths import late_vectors_dir

    return late_vectors_dir()


def store_folder(root: str | Path, variant: dict) -> Path:
    """The folder of one model variant's vectors (``variant``: fingerprint, dtype, max_length, int8)."""
    key = hashlib.sha256(json.dumps(variant, sort_keys=True).encode()).hexdigest()[:16]
    return Path(root) / key


def max_store_bytes() -> int | None:
    """The cap on the whole store (every variant's folder): ``$EFFRAG_LATE_VECTORS_MAX_GB`` GB, else
    :data:`DEFAULT_MAX_GB`; None when it is 0 (never pruned). Anything but a finite number >= 0 (``lots``, ``nan``,
    ``inf``, ``1e400``, ``-1``) is a ValueError naming the variable: one line, raised when a store opens
    (:class:`VectorStore`), before any chunk is encoded (``inf`` was an OverflowError traceback after the encoding)."""
    raw = (os.environ.get(MAX_GB_ENV) or "").strip()
    if not raw:
        return int(DEFAULT_MAX_GB * 1e9)
    try:
        gb = float(raw)
    except ValueError:
        gb = math.nan
    if not math.isfinite(gb) or gb < 0:
        raise ValueError(f"{MAX_GB_ENV}={raw!r}: expected a finite number of GB >= 0 (0: never pruned; unset: "
                         f"{DEFAULT_MAX_GB:g})")
    return None if gb == 0 else int(min(gb, 1e18) * 1e9)


def _entries(folder: Path, pattern: str) -> list[Path]:
    """The entries of ``folder`` matching ``pattern``; none when the folder is gone (another process pruned it)."""
    try:
        with os.scandir(folder) as it:
            return [folder / e.name for e in it if fnmatch.fnmatch(e.name, pattern)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _writer_gone(pid: int | None) -> bool:
    """Whether no process ``pid`` runs here (None: a name without a pid, an older effrag's temporary)."""
    if pid is None:
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists under another user
        return False
    return False


def _stale_temp(path: Path, mtime: float, now: float) -> bool:
    """A temporary shard no write will finish: its writer is gone (and it was last written over
    :data:`TEMP_GRACE_S` ago), or untouched for :data:`TEMP_MAX_AGE_S`."""
    age = now - mtime
    return age > TEMP_MAX_AGE_S or (age > TEMP_GRACE_S and _writer_gone(temp_owner(path.name)))


def prune(root: str | Path, max_bytes: int | None, keep: Iterable[str | Path] = ()) -> tuple[int, int]:
    """Remove the temporary files killed writers left under ``root`` (every variant's folder), then the least
    recently used shards (a shard's modification time is its last use: :meth:`VectorStore.load` touches what it
    reads) until shards and temporary files hold at most ``max_bytes`` (None: no cap), never one of ``keep``; a
    folder left empty goes too. Returns (files removed, bytes freed). Removing is always safe: a missing shard's
    chunks are encoded again at their next opening. A file or folder another process removes meanwhile is skipped."""
    kept = {Path(p).resolve() for p in keep}
    now = time.time()
    shards, temps = [], []
    for folder in _entries(Path(root), "*"):
        for kind, pattern in ((shards, SHARD_GLOB), (temps, TEMP_GLOB)):
            for path in _entries(folder, pattern):
                try:
                    st = path.stat()
                except OSError:  # removed meanwhile by another process
                    continue
                kind.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in shards + temps)
    removed = freed = 0

    def remove(path: Path, size: int) -> None:
        nonlocal total, removed, freed
        try:
            path.unlink()
        except OSError:
            return
        total, removed, freed = total - size, removed + 1, freed + size
        try:
            path.parent.rmdir()  # only once empty
        except OSError:
            pass

    for mtime, size, path in temps:
        if _stale_temp(path, mtime, now):
            remove(path, size)
    for _, size, path in sorted(shards, key=lambda s: s[0]):
        if max_bytes is None or total <= max_bytes:
            break
        if path.resolve() not in kept:
            remove(path, size)
    return removed, freed


class VectorStore:
    """The shards of one model variant's chunk vectors (see the module's docstring)."""

    def __init__(self, folder: str | Path, variant: dict):
        self.folder = Path(folder)
        self.variant = {k: variant[k] for k in sorted(variant)}
        self._variant_json = json.dumps(self.variant, sort_keys=True)
        self.unwritable: str | None = None  # why a write failed (then no more are tried)
        self.used: set[Path] = set()  # the shards this store read or wrote: never pruned by it
        self.max_bytes = max_store_bytes()  # checked now, before anything is encoded
        self._open: dict[str, Shard] = {}  # name -> the shard as opened
        self._keys = np.zeros(0, dtype="<u8")  # sorted lookup keys of every opened shard's chunks ...
        self._where = np.zeros((0, 2), dtype=np.int64)  # ... and their (shard number, row)
        self._order: list[str] = []  # shard number -> name

    def _shards(self) -> list[Path]:
        return sorted(_entries(self.folder, SHARD_GLOB))

    def _refuse(self, path: Path, why: str) -> None:
        _log.warning("late-interaction vectors %s: %s; removed, its chunks will be encoded again", path, why)
        try:
            path.unlink()
        except OSError:
            pass

    def _drop(self, name: str) -> None:
        """Forget an opened shard (refused): its chunks are misses from now on."""
        self._open.pop(name, None)
        self._reindex()

    def refresh(self) -> int:
        """Open the shards written since the last look (their headers only); returns how many chunks are known."""
        new = False
        for path in self._shards():
            if path.name in self._open:
                continue
            try:
                self._open[path.name] = Shard(path, self._variant_json)
                new = True
            except FileNotFoundError:  # removed by another process since it was listed: a miss, not damage
                continue
            except Refused as e:
                self._refuse(path, str(e))
            except (OSError, RuntimeError, ValueError) as e:
                self._refuse(path, f"unreadable ({str(e)[:120]})")
        if new:
            self._reindex()
        return len(self._keys)

    def _reindex(self) -> None:
        self._order = sorted(self._open)
        keys = [self._open[n].keys for n in self._order]
        where = [np.stack([np.full(len(k), i), np.arange(len(k))], 1) for i, k in enumerate(keys)]
        keys = np.concatenate(keys) if keys else np.zeros(0, dtype="<u8")
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._where = np.concatenate(where)[order] if where else np.zeros((0, 2), dtype=np.int64)

    def _locate(self, digest: bytes) -> list[tuple[str, int]]:
        """Every (shard name, row) whose lookup key is this digest's (a key shared by two digests: both)."""
        key = np.frombuffer(digest[:8], dtype="<u8")[0]
        lo = int(np.searchsorted(self._keys, key, "left"))
        hi = int(np.searchsorted(self._keys, key, "right"))
        return [(self._order[int(s)], int(r)) for s, r in self._where[lo:hi]]

    def contains(self, digests: Iterable[bytes]) -> set[bytes]:
        """Which of ``digests`` an opened shard holds (headers only: nothing is read or checked beyond them)."""
        self.refresh()
        out = set()
        for d in digests:
            for name, row in self._locate(d):
                if self._open[name].digests[row].numpy().tobytes() == d:
                    out.add(d)
                    break
        return out

    def load(self, digests: Iterable[bytes]) -> dict[bytes, torch.Tensor]:
        """The stored payload of each of ``digests`` found in a shard that passes its checks (each chunk read from
        its memory map and checked as it is read). A shard with one chunk that fails is refused whole: nothing read
        from it is returned."""
        wanted = list(dict.fromkeys(digests))
        found: dict[bytes, torch.Tensor] = {}
        for attempt in (1, 2):
            if attempt == 2 or not self._open:
                self.refresh()
            by_shard: dict[str, list[tuple[int, bytes]]] = {}
            for d in wanted:
                if d in found:
                    continue
                for name, row in self._locate(d):
                    if self._open[name].digests[row].numpy().tobytes() == d:
                        by_shard.setdefault(name, []).append((row, d))
                        break
            for name, rows in by_shard.items():
                shard = self._open[name]
                try:
                    got = {d: shard.read(row, d) for row, d in rows}
                except Refused as e:
                    self._refuse(shard.path, str(e))
                    self._drop(name)
                    continue
                found.update(got)
                if shard.path not in self.used:  # a shard that served: its last use, which pruning goes by
                    self.used.add(shard.path)
                    try:
                        os.utime(shard.path)
                    except OSError:
                        pass
            if len(found) == len(wanted):
                break
        return found

    def add(self, digests: Sequence[bytes], payloads: Sequence[torch.Tensor]) -> Path | None:
        """Write one shard of ``payloads`` (each [T, ...]: a chunk's vectors or codes) keyed by ``digests``; returns
        its path (None if empty). Written to a temporary name and renamed: a kill leaves no partial shard."""
        from safetensors.torch import save_file

        if not digests or self.unwritable:
            return None
        digs = torch.frombuffer(bytearray(b"".join(digests)), dtype=torch.uint8).reshape(len(digests), DIGEST_BYTES)
        offs = torch.tensor([0] + [len(v) for v in payloads], dtype=torch.int64).cumsum(0)
        payload = torch.cat([v.cpu() for v in payloads]).contiguous()
        checks = torch.frombuffer(bytearray(b"".join(chunk_check(d, v.cpu()) for d, v in zip(digests, payloads))),
                                  dtype=torch.uint8).reshape(len(digests), CHECK_BYTES)
        meta = {"format": FORMAT, "variant": self._variant_json, "sha256": tensor_hash(digs, offs, checks)}
        path = self.folder / f"vectors-{hashlib.sha256(digs.numpy().tobytes()).hexdigest()[:16]}.safetensors"
        for attempt in (1, 2):
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                with atomic_path(path) as tmp:  # a kill leaves a temporary file, which a later prune removes
                    save_file({"digests": digs, "offsets": offs, "checks": checks, "payload": payload}, str(tmp),
                              metadata=meta)
                break
            except (OSError, RuntimeError) as e:
                if attempt == 1 and not self.folder.is_dir():  # pruned, empty, by another process since mkdir
                    continue
                # a read-only home, a full disk: the vectors serve this process only
                self.unwritable = f"{type(e).__name__}: {e}"
                _log.warning("late-interaction vectors: cannot write to %s (%s); this corpus will be encoded again at "
                             "its next opening (set EFFRAG_CACHE_DIR to a writable folder)", self.folder,
                             self.unwritable)
                return None
        self.used.add(path)
        return path

    def prune_others(self) -> None:
        """Keep the whole store (every variant's folder beside this one) within :func:`max_store_bytes`: the least
        recently used shards go first, never one this store read or wrote; temporary files of killed writes go once
        stale, also with no cap (:func:`prune`)."""
        cap = self.max_bytes
        if self.unwritable or (self.folder.parent / KEEP_MARKER).is_file():
            return
        removed, freed = prune(self.folder.parent, cap, keep=self.used)  # cap None: only killed writers' leftovers
        if removed:
            _log.info("late-interaction vectors: removed the %d least recently used shards or temporary files of "
                      "killed writes (%.1f MB) to keep %s within %s (%s)", removed, freed / 1e6, self.folder.parent,
                      "no cap" if cap is None else f"{cap / 1e9:g} GB", MAX_GB_ENV)


def index_vector_store(retriever) -> Path | None:
    """The vector store root an index was built with (``<index>/late-vectors``), if the retriever was opened from
    such an index (:func:`effrag.setup.open_index` records where)."""
    folder = getattr(retriever, "index_dir", None)
    if folder is None:
        return None
    root = Path(folder) / VECTORS_DIR
    return root if root.is_dir() else None
