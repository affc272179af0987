"""Content hashes of saved indexes and checkpoints, checked when they are loaded.

Saving records, for every file it wrote, the size and the sha256 (and, for files
over :data:`FULL_HASH_LIMIT`, a *sampled* sha256 as well); loading compares them,
so that a flipped block, a truncated copy or a half-finished download is an
:class:`IntegrityError` naming the file instead of silently worse results.

How much is checked (``verify=`` of the loaders, else the ``EFFRAG_VERIFY``
environment variable, else ``"cheap"``):

``"cheap"`` (default)
    the size of every recorded file, the full sha256 of files up to
    :data:`FULL_HASH_LIMIT` (128 MiB), and for larger files the sha256 of
    :data:`SAMPLE_BLOCKS` blocks of :data:`SAMPLE_BLOCK` bytes (1 MiB) spread evenly
    over the file, the first and the last included. Why not the full hash: an
    index of a Wikipedia-sized corpus holds tens of GB of vectors, and hashing
    them at ~1 GB/s would add a minute to every load, while the cheap check reads
    at most 128 MiB of any file. Size catches truncation and partial copies
    (the common failures), the first/last blocks catch damaged headers and tails
    (FAISS and safetensors keep their layout there) and the spread blocks catch a
    share of damage in the middle; damage in an unsampled region of a large file
    is only caught by ``"full"``. The small files (BM25 arrays and corpora of up to
    ~100k passages, checkpoints up to MiniLM size) always get a full hash. Saving
    always computes the full sha256 (one extra read of what was just written), so
    that ``"full"`` can be asked for later.
``"full"``
    the full sha256 of every recorded file (``EFFRAG_VERIFY=full``), e.g. once
    after a download or a copy between machines.
``"off"``
    nothing.

Files saved before hashes were recorded (or whose records were removed) carry no
record and load unchecked; a warning says so once per folder and process. Unreadable files found while loading (a bad FAISS,
safetensors or ``.npy`` header) are a :class:`CorruptFileError` naming the file.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
from pathlib import Path

from .paths import first_use_records
from .provenance import file_sha256

log = logging.getLogger(__name__)
_UNVERIFIED_WARNED: set[str] = set()  # folders already warned about, once per process

ENV = "EFFRAG_VERIFY"
MODES = ("off", "cheap", "full")
FULL_HASH_LIMIT = 128 * 1024 * 1024
SAMPLE_BLOCK = 1024 * 1024
SAMPLE_BLOCKS = 16


class IntegrityError(ValueError):
    """A saved file is not what was saved: other size or content, missing, unreadable, or holds NaN/Inf."""


class CorruptFileError(IntegrityError):
    """A file could not be read back (damaged header or truncated data)."""


class NonFiniteWeightsError(IntegrityError):
    """A checkpoint holds NaN or Inf weights."""


def resolve_mode(verify: str | None = None) -> str:
    """``verify`` if given, else ``$EFFRAG_VERIFY``, else ``"cheap"``; anything else is a ValueError."""
    source = "verify" if verify is not None else ENV
    mode = verify if verify is not None else (os.environ.get(ENV) or "cheap")
    mode = str(mode).strip().lower()
    if mode not in MODES:
        raise ValueError(f"{source}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def sampled_sha256(path: str | Path, block: int = SAMPLE_BLOCK, blocks: int = SAMPLE_BLOCKS) -> str:
    """sha256 of ``blocks`` blocks of ``block`` bytes at evenly spaced offsets, the first and last included."""
    size = Path(path).stat().st_size
    h = hashlib.sha256(str(size).encode())
    last = max(0, size - block)
    offsets = sorted({round(i * last / (blocks - 1)) for i in range(blocks)}) if blocks > 1 else [0]
    with open(path, "rb") as f:
        for off in offsets:
            f.seek(off)
            h.update(f.read(block))
    return h.hexdigest()


def file_record(path: str | Path) -> dict:
    """``{"size", "sha256"}`` of a file, plus ``"sample"`` (see :func:`sampled_sha256`) when it is large."""
    path = Path(path)
    rec = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    if rec["size"] > FULL_HASH_LIMIT:  # the sampling is recorded with the hash: a later change of it stays readable
        block, blocks = SAMPLE_BLOCK, SAMPLE_BLOCKS
        rec["sample"] = {"block": block, "blocks": blocks, "sha256": sampled_sha256(path, block, blocks)}
    return rec


def record_files(directory: str | Path, names) -> dict:
    """Records of the files ``names`` (paths relative to ``directory``), sorted by name."""
    d = Path(directory)
    return {str(n): file_record(d / n) for n in sorted({str(n) for n in names})}


def verify_files(directory: str | Path, records: dict | None, verify: str | None = None, *,
                 what: str = "saved files", fix: str = "rebuild it", record_hint: str = "") -> str:
    """Check the files of ``directory`` against ``records`` (from :func:`record_files`); return the mode used.

    ``records`` None (saved before hashes were recorded, or the records were removed) skips the check
    with a warning, once per folder (``record_hint``: how to record them). Raises :class:`IntegrityError`
    on the first file that is missing or differs.
    """
    mode = resolve_mode(verify)
    d = Path(directory)
    if mode == "off":
        return mode
    if records is None:
        key = str(d.resolve())
        if key not in _UNVERIFIED_WARNED:
            _UNVERIFIED_WARNED.add(key)
            log.warning("%s: no file hashes recorded (saved by an older effrag, or removed): the %s is not "
                        "verified%s", d, what, f"; {record_hint}" if record_hint else "")
        return "off"
    for name, rec in records.items():
        path = d / name
        if not path.is_file():
            raise IntegrityError(f"{path}: file of the {what} is missing; {fix}")
        size = path.stat().st_size
        if size != rec["size"]:
            raise IntegrityError(f"{path}: size is {size} bytes, but {rec['size']} were saved "
                                 f"(truncated or partly copied); {fix}")
        sample = rec.get("sample")
        if mode == "cheap" and sample:
            if sampled_sha256(path, sample["block"], sample["blocks"]) != sample["sha256"]:
                raise IntegrityError(f"{path}: content differs from what was saved (sampled sha256 mismatch; "
                                     f"file corrupted or modified); {fix}")
        elif file_sha256(path) != rec["sha256"]:
            raise IntegrityError(f"{path}: content differs from what was saved (sha256 mismatch; "
                                 f"file corrupted or modified); {fix}")
    return mode


def short_error(e: BaseException, limit: int = 200) -> str:
    """One line of a low-level error message (FAISS's carry a C++ location first)."""
    text = " ".join(str(e).split()) or type(e).__name__
    if text.startswith("Error in ") and ": " in text:  # FAISS: "Error in <signature> at <file>:<line>: <what>"
        tail = text.split(" at ", 1)[-1]
        text = tail.split(": ", 1)[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def writing(path: str | Path):
    """A failed write of ``path`` (a full disk, numpy's or FAISS's short write, an I/O error) as one ``OSError``
    naming the file, ``errno.ENOSPC`` when its filesystem has no space left: the command line says it in one line
    (``effrag.cli``), and what was finished before stays (every long job resumes)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if isinstance(e, OSError) and e.filename:
            raise
        if isinstance(e, RuntimeError) and "write" not in str(e).lower():  # FAISS: "... fwrite ... failed"
            raise
        folder = Path(path).parent
        try:
            full = shutil.disk_usage(folder).free == 0
        except OSError:
            full = False
        code = errno.ENOSPC if full else (getattr(e, "errno", None) or errno.EIO)
        raise OSError(code, "no space left on device" if full else short_error(e), str(path)) from None


def check_first_use(files, what: str, fix: str, verify: str | None = None) -> None:
    """Refuse weight ``files`` that differ from what they were when effrag first read them: their full sha256 and
    size are recorded on first use (:func:`first_use_records`) and compared on every later load (``EFFRAG_VERIFY``
    ``off`` skips it); one :class:`IntegrityError` naming the file, what it is (``what``) and ``fix``. Damage present
    before the first use is for the loader's own checks (NaN/Inf weights, headers) to catch."""
    import json

    if resolve_mode(verify) == "off":
        return
    store = first_use_records()
    try:
        records = json.loads(store.read_text()) if store.is_file() else {}
    except (OSError, ValueError):
        records = {}  # an unreadable record file is recorded anew: it only guards later loads
    changed = False
    for f in map(Path, files):
        key = str(f.resolve())
        now = file_record(f)
        seen = records.get(key)
        if seen is None:
            records[key], changed = {"size": now["size"], "sha256": now["sha256"]}, True
        elif (seen["size"], seen["sha256"]) != (now["size"], now["sha256"]):
            raise IntegrityError(f"{f}: the {what}'s weights differ from what effrag read when it first used them "
                                 f"({'size' if seen['size'] != now['size'] else 'sha256'} mismatch, recorded in "
                                 f"{store}); {fix} (if you replaced it on purpose, delete its entry there)")
    if changed:
        records = {k: v for k, v in records.items() if Path(k).is_file()}  # files since removed leave no record
        from .state_files import write_text_atomic

        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(store, json.dumps(records, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only cache: nothing recorded, later loads rely on the loader's own checks
