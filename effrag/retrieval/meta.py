"""``index_meta.json``: what a saved index was built from (kind, corpus and encoder fingerprints,
options, package versions) and the size and sha256 of every file it holds (``files``,
checked on load, see :mod:`effrag.integrity`), written last so that a folder without
it is an unfinished build.

Its own module so that the backends (dense, BM25, hybrid) and the builder/loader in
:mod:`.index` both depend on it and not on each other.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ..integrity import CorruptFileError, IntegrityError, record_files, verify_files
from ..provenance import package_versions
from ..state_files import write_text_atomic

META = "index_meta.json"


class IndexMismatchError(ValueError):
    """A saved index does not belong to the given corpus or encoder."""


REBUILD = "rebuild the index"
# what a saved index may hold besides index_meta.json (emb_shards: a dense build in progress; part<i>: hybrid)
INDEX_ENTRIES = ("index.faiss", "bm25", "corpus.jsonl", "milvus.db", "emb_shards")


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
    write_text_atomic(directory / META, json.dumps(meta, indent=2))


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
    return verify_files(directory, meta.get("files"), verify, what="index", fix=REBUILD,
                        record_hint=f"`effrag index verify {directory} --record` records them")


def index_files(directory: Path, meta: dict) -> list[str]:
    """The files an index of ``meta["kind"]`` writes (what ``files`` records), relative to ``directory``."""
    kind, d = meta.get("kind"), Path(directory)
    if kind == "dense":
        names = ["index.faiss"]
    elif kind == "bm25":
        names = files_under(d, "bm25")
    elif kind == "hybrid":
        names = [f for i in range(len(meta.get("options", {}).get("parts", []))) for f in files_under(d, f"part{i}")]
    elif kind == "milvus":
        names = []  # the vectors live in the Milvus collection
    else:
        raise CorruptFileError(f"{d / META}: unknown index kind {kind!r}; {REBUILD}")
    return names + (["corpus.jsonl"] if (d / "corpus.jsonl").is_file() else [])


def record_index(directory: str | Path) -> int:
    """Add the ``files`` records to an index saved without them (``effrag index verify DIR --record``); returns how
    many files were recorded. An index that has records is not re-recorded (that would bless a changed file)."""
    d = Path(directory)
    meta = read_meta(d)
    if meta.get("files") is not None:
        raise IntegrityError(f"{d / META}: already records its files; `effrag index verify {d}` checks them")
    names = index_files(d, meta)
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise IntegrityError(f"{d / missing[0]}: file of the index is missing; {REBUILD}")
    meta["files"] = record_files(d, names)
    write_text_atomic(d / META, json.dumps(meta, indent=2))
    return len(names)


def remove_index(directory: str | Path) -> None:
    """Delete a saved index's own files from ``directory`` (``effrag index build --overwrite``), nothing else:
    a new index of another kind must not find a stale ``index.faiss`` or ``bm25/`` beside it."""
    d = Path(directory)
    (d / META).unlink(missing_ok=True)  # first: a half-removed folder is no index
    for name in INDEX_ENTRIES + tuple(p.name for p in d.glob("part*") if p.is_dir()):
        path = d / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
