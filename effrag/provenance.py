"""Provenance written beside every checkpoint, index, run and report: versions, command, data hashes.

One home, so that a training run's ``run_info.json``, an index's ``index_meta.json``, an
evaluation's ``config.json`` and a benchmark's report all record the same things the same way.
"""
from __future__ import annotations

import hashlib
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

# Packages whose versions change results (retrieval, training, generation).
PACKAGES = ("effrag", "numpy", "torch", "transformers", "accelerate", "faiss-cpu", "faiss-gpu-cu12", "bm25s",
            "PyStemmer", "llama-cpp-python")


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Python's and each installed package's version (absent packages are left out)."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def command_line(argv: Sequence[str] | None = None, prog: str | None = None) -> str:
    """The command as typed: ``prog`` (default the script's name) and its arguments (default ``sys.argv``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([prog or Path(sys.argv[0]).name, *args])


def provenance(*, argv: Sequence[str] | None = None, prog: str | None = None, files: Iterable[str | Path] = (),
               **extra: Any) -> dict[str, Any]:
    """``{"command", "versions", "data_sha256", "created", **extra}`` for a report or checkpoint."""
    return {"command": command_line(argv, prog), "versions": package_versions(),
            "data_sha256": {str(f): file_sha256(f) for f in dict.fromkeys(map(str, files)) if f and Path(f).is_file()},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}


def write_report(out_dir: str | Path, markdown: str, data: dict[str, Any], *, args: Any = None,
                 argv: Sequence[str] | None = None, prog: str | None = None, files: Iterable[str | Path] = (),
                 md_name: str = "report.md", json_name: str = "report.json") -> None:
    """A benchmark's ``report.md`` and ``report.json``: ``data`` plus the script's options (``args``,
    an argparse namespace) and its :func:`provenance`, so every figure says how it was made."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / md_name).write_text(markdown)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} if args is not None else {}
    (out / json_name).write_text(json.dumps({"config": config, **data, **provenance(argv=argv, prog=prog, files=files)},
                                            indent=2, default=str))
