"""Write a file whole or not at all, and read a state file back naming it: the one way effrag writes its state,
progress, record and meta files (resume markers, ``*.progress.json``, ``index_meta.json``, ``effrag_config.json``,
``trainer_state.json``, shards, ...).

Why one helper: a file written in place (``path.write_text``) is torn by a kill in the middle, and a JSON document cut
after 10 bytes was ``effrag: error: Expecting value: line 1 column 10`` at the next run, naming no file; a file
renamed into place without an fsync can be empty or short after a power loss, because the rename may reach the
disk before the data does. Here the bytes go to a temporary sibling (same folder: the rename stays on one
filesystem), are flushed and fsynced, renamed over the target with ``os.replace``, and the folder is fsynced where
the OS allows: after any crash the target holds the old content or the new, whole. ``tests/test_state_writes.py``
fails on a new write that bypasses this module.

Temporary names are ``<name>.tmp<pid>-<n>`` (:func:`temp_owner` reads the pid back), so a leftover of a killed
writer says which process made it.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_serial = itertools.count()
_TEMP = re.compile(r"\.tmp(\d+)(?:-\d+)?$")


def temp_name(path: Path) -> Path:
    """A fresh temporary sibling of ``path``: ``<name>.tmp<pid>-<n>`` (unique per process and call)."""
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{next(_serial)}")


def temp_owner(name: str) -> int | None:
    """The pid in a temporary name (``...tmp<pid>`` or ``...tmp<pid>-<n>``), None for any other name."""
    m = _TEMP.search(name)
    return int(m.group(1)) if m else None


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder (its entries: a rename into it is then on disk); a no-op where the OS cannot open folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str | Path, path: str | Path) -> Path:
    """Rename a file written completely (``tmp``) onto ``path`` durably: fsync it, ``os.replace``, fsync the folder.
    For outputs grown in place as a resumable ``.partial`` and renamed once finished."""
    tmp, path = Path(tmp), Path(path)
    _fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write the new content to by any means (safetensors, numpy, llama.cpp); on a
    normal exit it is fsynced and renamed onto ``path`` (:func:`commit`), on an exception removed. An OS error that
    names no file (a full disk met by a flush) is raised again naming ``path``, for a one-line message. (A writer
    that reports a full disk as a short write without an errno, numpy or FAISS, goes inside
    :func:`effrag.integrity.writing`; this module imports nothing of effrag, so that every module may use it.)"""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        commit(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno and not e.filename:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``open(path, mode)`` whose content replaces ``path`` whole when the block ends (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Replace ``path`` with ``data``, whole or not at all."""
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text``, whole or not at all."""
    return write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """Replace ``path`` with ``json.dumps(obj, **dumps)`` and a newline, whole or not at all."""
    return write_text_atomic(path, json.dumps(obj, **dumps) + "\n")


def read_json(path: str | Path, fix: str = "remove it and run again") -> Any:
    """The JSON document in state file ``path``; one that does not parse (torn by a write of an older effrag, damaged,
    not UTF-8) is a ValueError naming the file and ``fix``, one line for the command line."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a readable state file (not UTF-8 at byte offset {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a readable state file (torn or damaged JSON: {e.msg}: line {e.lineno} "
                         f"column {e.colno}); {fix}") from None
