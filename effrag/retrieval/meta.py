"""``index_meta.json``: what a saved index was built from (kind, corpus and encoder fingerprints,
options, package versions) and the size and sha256 of every file it holds (``files``,
checked on load, see :mod:`effrag.integrity`), written last so that a folder without
it is an unfinished build.

Its own module so that the backends (dense, BM25, hybrid) and the builder/loader in
:mod:`.index` both depend on it and not on each other.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..integrity import CorruptFileError, record_files, verify_files
from ..provenance import package_versions

META = "index_meta.json"


class IndexMismatchError(ValueError):
    """A saved index does not belong to the given corpus or encoder."""


REBUILD = "rebuild the index"


def write_meta(directory: Path, kind: str, corpus, options: dict, encoder=None, write_corpus: bool = True,
               files=()) -> None:
    """Write ``index_meta.json``; ``files`` are the paths (relative to ``directory``) the backend wrote.

    Their sizes and sha256 (and ``corpus.jsonl``'s) are recorded under ``files``.
    """
    directory = Path(directory)
    files = list(files)
    if write_corpus:
        corpus.save(directory / "corpus.jsonl")
        files.append("corpus.jsonl")
    meta = {"kind": kind, "corpus": {"fingerprint": corpus.fingerprint(), "size": len(corpus)},
            "options": options, "versions": package_versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "files": record_files(directory, files)}
    if encoder is not None:
        meta["encoder"] = {"fingerprint": encoder.fingerprint(), "settings": encoder.settings(), "bf16": encoder.bf16}
    (directory / META).write_text(json.dumps(meta, indent=2))


def read_meta(directory: str | Path) -> dict:
    path = Path(directory) / META
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"index folder not found: {directory}")
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not an effrag index (no {META}; unfinished build?)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: not valid JSON ({e}); {REBUILD}") from None


def files_under(directory: Path, sub: str) -> list[str]:
    """Paths, relative to ``directory``, of every file under ``directory/sub``."""
    return [p.relative_to(directory).as_posix() for p in sorted((directory / sub).rglob("*")) if p.is_file()]


def verify_index(directory: str | Path, meta: dict | None = None, verify: str | None = None) -> str:
    """Check the files of a saved index against the sizes and hashes in its ``index_meta.json``.

    ``verify``: ``"cheap"`` (default, or ``$EFFRAG_VERIFY``), ``"full"`` or ``"off"``, see
    :mod:`effrag.integrity`. Raises :class:`~effrag.integrity.IntegrityError` naming the
    file that differs; an index saved before hashes were recorded passes unchecked.
    Returns the mode used (``"off"`` when nothing was checked).
    """
    meta = read_meta(directory) if meta is None else meta
    return verify_files(directory, meta.get("files"), verify, what="index", fix=REBUILD)
