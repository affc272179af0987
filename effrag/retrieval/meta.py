"""``index_meta.json``: what a saved index was built from (kind, corpus and encoder fingerprints,
options, package versions), written last so that a folder without it is an unfinished build.

Its own module so that the backends (dense, BM25, hybrid) and the builder/loader in
:mod:`.index` both depend on it and not on each other.
"""
from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path

META = "index_meta.json"


class IndexMismatchError(ValueError):
    """A saved index does not belong to the given corpus or encoder."""


def package_versions() -> dict[str, str]:
    """Versions of the packages that change retrieval results (for metadata and run configs)."""
    out = {"python": platform.python_version()}
    for name in ("effrag", "numpy", "torch", "transformers", "faiss-cpu", "faiss-gpu-cu12", "bm25s", "PyStemmer"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_meta(directory: Path, kind: str, corpus, options: dict, encoder=None, write_corpus: bool = True) -> None:
    if write_corpus:
        corpus.save(directory / "corpus.jsonl")
    meta = {"kind": kind, "corpus": {"fingerprint": corpus.fingerprint(), "size": len(corpus)},
            "options": options, "versions": package_versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if encoder is not None:
        meta["encoder"] = {"fingerprint": encoder.fingerprint(), "settings": encoder.settings(), "bf16": encoder.bf16}
    (directory / META).write_text(json.dumps(meta, indent=2))


def read_meta(directory: str | Path) -> dict:
    path = Path(directory) / META
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"index folder not found: {directory}")
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not an effrag index (no {META}; unfinished build?)")
    return json.loads(path.read_text())
