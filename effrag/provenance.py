"""Provenance written beside every checkpoint, index, run and report: versions, command, data hashes.

One home, so that a training run's ``run_info.json``, an index's ``index_meta.json``, an
evaluation's ``config.json`` and a benchmark's report all record the same things the same way.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

# Packages whose versions change results (retrieval, training, generation).
PACKAGES = ("effrag", "numpy", "torch", "transformers", "accelerate", "faiss-cpu", "faiss-gpu-cu12", "bm25s",
            "PyStemmer", "llama-cpp-python")


# ---------------------------------------------------------------------------- portable paths
# What a file the project ships or commits (a model card, a checkpoint's effrag_config.json, a report) may say
# about where things were: paths relative to the repository, or under a named root, never this machine's layout.
DATA_ROOT = "../shared/data"  # the dataset folder beside the repository, as every script's --data default names it
_ABSOLUTE = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.@+-]+/)+[\w.@+-]+/?")  # two parts at least: not "a /10" or URLs


def repo_root() -> Path:
    """The repository effrag runs from (the folder holding ``pyproject.toml`` above the package), else the
    working directory (an installed package)."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").is_file() else Path.cwd().resolve()


def path_roots() -> dict[str, str]:
    """Absolute folder -> what a portable path writes instead (``""``: relative to the repository), longest
    first so the most specific root wins: the data root (``$DATA`` or ``../shared/data``) as ``<data>``,
    the Python packages as ``<site-packages>``, the repository, the temporary folder as ``<tmp>``, home as ``~``."""
    repo = repo_root()
    roots = {str(Path(os.environ.get("DATA") or repo / DATA_ROOT).resolve()): "<data>",
             sysconfig.get_paths()["purelib"]: "<site-packages>", str(repo): "",
             str(Path(tempfile.gettempdir()).resolve()): "<tmp>", str(Path.home()): "~"}
    return dict(sorted(roots.items(), key=lambda kv: -len(kv[0])))


def portable_path(path: str | Path, roots: Mapping[str, str] | None = None) -> str:
    """``path`` as a shipped or committed file may record it: relative to the repository when inside it,
    ``<data>/hotpotqa/dev.jsonl`` under the data root (and ``<site-packages>``, ``<tmp>``, ``~`` likewise), or
    ``<elsewhere>/NAME`` for any other absolute path. Relative paths are kept as given."""
    text = str(path)
    if not text.startswith("/"):
        return text
    for root, name in (path_roots() if roots is None else roots).items():
        root = root.rstrip("/")
        if text == root or text.startswith(root + "/"):
            rest = text[len(root):].lstrip("/")
            return (f"{name}/{rest}" if rest else name) if name else (rest or ".")
    return f"<elsewhere>/{Path(text).name}"


def portable_text(text: str, roots: Mapping[str, str] | None = None) -> str:
    """``text`` (a command line, a note) with every absolute path under one of the ``roots`` made
    :func:`portable_path`; other absolute paths (``/dev/null``, ``/proc/cpuinfo``) are the same everywhere."""
    roots = path_roots() if roots is None else roots
    under = tuple(r.rstrip("/") + "/" for r in roots)

    def swap(m: re.Match) -> str:
        path = m.group(0)
        return portable_path(path, roots) if (path.rstrip("/") + "/").startswith(under) else path
    return _ABSOLUTE.sub(swap, text)


def portable(value: Any, roots: Mapping[str, str] | None = None) -> Any:
    """A JSON-like value with :func:`portable_text` applied to every string in it (keys included)."""
    roots = path_roots() if roots is None else roots
    if isinstance(value, str):
        return portable_text(value, roots)
    if isinstance(value, Path):
        return portable_path(value, roots)
    if isinstance(value, dict):
        return {portable(k, roots): portable(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, roots) for v in value]
    return value


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Python's and each installed package's version (absent packages are left out)."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


DIRTY = " + uncommitted changes"  # how source_commit marks a tree whose tracked code differs from the commit
DIFF_NAME = "uncommitted.diff"  # what report_source writes beside a report measured on such a tree
# What runs write and people document, not what computes a figure: a change there leaves the code committed. The
# recipe writes checkpoints/ and an export, reports write reports/; the models and configs these hold are recorded
# by their own hashes (a loop config's model_files, export.json), not by the commit.
NOT_CODE = ("checkpoints", "reports", "effrag/pretrained", "docs", "runs", "**/*.md")
CODE_PATHSPEC = ("--", ".", *(f":(exclude,glob){p}" if "*" in p else f":(exclude){p}" for p in NOT_CODE))


def source_commit(repo: str | Path | None = None) -> str:
    """The commit a figure was measured on, as a report names it: the short hash, with ``+ uncommitted changes``
    when tracked code differs from it (a figure measured on an uncommitted tree must not name the commit before
    the change; files under :data:`NOT_CODE` do not count), ``unknown`` outside a git checkout."""
    import subprocess

    where = str(repo or repo_root())
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", *CODE_PATHSPEC], cwd=where,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{DIRTY}" if dirty else head


def report_source(out_dir: str | Path | None = None, allow_dirty: bool = False, *, name: str = DIFF_NAME,
                  repo: str | Path | None = None) -> str:
    """The commit a report script's figures come from, checked before the script does its work (issue: figures
    from committed code only). A clean tree: the short hash, and a stale ``name`` left in ``out_dir`` by an earlier
    run on an uncommitted tree is removed. A tree with uncommitted changes ends the script with a one-line message,
    unless ``allow_dirty`` (``--allow-dirty``, :func:`effrag.cli_args.add_source_args`): then ``git diff HEAD`` of
    the tracked files, its absolute paths made portable, is written to ``out_dir/name``, and the commit says so:
    ``abc1234 + uncommitted changes (uncommitted.diff)``. Outside a git checkout: ``unknown``."""
    import subprocess

    commit = source_commit(repo)
    out = Path(out_dir) if out_dir is not None else None
    if not commit.endswith(DIRTY):
        if out is not None and (out / name).is_file():
            (out / name).unlink()
        return commit
    if not allow_dirty:
        raise SystemExit(f"the tree has uncommitted changes ({commit}): commit first, or --allow-dirty")
    if out is None:
        return commit
    from .state_files import write_text_atomic

    diff = subprocess.run(["git", "diff", "--no-color", "--no-ext-diff", "HEAD", *CODE_PATHSPEC], cwd=str(repo or repo_root()),
                          capture_output=True, text=True, errors="replace", check=True).stdout
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / name, portable_text(diff))
    return f"{commit} ({name})"


def committed_source(allow_dirty: bool = False, repo: str | Path | None = None) -> str:
    """:func:`report_source` for a script that writes no report folder (a dump, a model): a tree with uncommitted
    changes ends it with the same one-line message unless ``allow_dirty`` (then the commit says so, no diff)."""
    return report_source(None, allow_dirty, repo=repo)


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
    """``{"command", "commit", "versions", "data_sha256", "created", **extra}`` for a report or checkpoint:
    ``commit`` is :func:`source_commit` unless ``extra`` gives it (a script's :func:`report_source`)."""
    commit = extra.pop("commit", None) or source_commit()
    return {"command": command_line(argv, prog), "commit": commit, "versions": package_versions(),
            "data_sha256": {str(f): file_sha256(f) for f in dict.fromkeys(map(str, files)) if f and Path(f).is_file()},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}


def write_report(out_dir: str | Path, markdown: str, data: dict[str, Any], *, args: Any = None,
                 argv: Sequence[str] | None = None, prog: str | None = None, files: Iterable[str | Path] = (),
                 md_name: str = "report.md", json_name: str = "report.json", commit: str | None = None) -> None:
    """A benchmark's ``report.md`` and ``report.json``: ``data`` plus the script's options (``args``,
    an argparse namespace) and its :func:`provenance`, so every figure says how it was made; ``commit`` (or
    ``data["commit"]``): what :func:`report_source` returned when the script started."""
    import json

    from .state_files import write_text_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / md_name, markdown)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} if args is not None else {}
    prov = provenance(argv=argv, prog=prog, files=files, commit=commit or data.get("commit"))
    # the options and the command as a committed report may hold them: no path of this machine
    write_text_atomic(out / json_name, json.dumps({"config": portable(config), **data, **portable(prov)}, indent=2,
                                                  default=str))
