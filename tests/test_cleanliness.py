"""What the project ships and commits speaks of the project alone (issue #41): no absolute path of the machine a
file was made on, and no internal, numbered work periods ("session 14") in place of a date, a commit or a report.

Scanned: every text file git tracks (the package data included: model cards, ``effrag_config.json``, loop configs,
prompts, the bundled sample; every checkpoint record, report, script and test), and where there is no git
checkout, ``effrag/``, ``docs/``, ``reports/``, ``checkpoints/`` and ``README.md``. A script's ``#!`` line and this
file's own examples are not offences. A failure names each file and line. Code that writes such files records paths through
``effrag.provenance.portable_path`` (repo-relative, ``<data>/...``).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED = ["effrag", "docs", "reports", "checkpoints", "README.md"]  # without git
BINARY_SUFFIXES = {".safetensors", ".png", ".jpg", ".pdf", ".pyc", ".npy", ".npz", ".faiss", ".gguf", ".bin", ".db",
                   ".sqlite", ".arrow", ".parquet", ".pt", ".pkl"}
# a path from the file-system root of some machine (not a URL, not "a/b", not "<data>/x" or "~/x")
ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>:/-])/(?:work|tmp|home|root|Users|mnt|scratch|data|srv|var|opt|usr|private|"
                           r"nfs|gpfs|lustre)/[\w.@+-]")
WORK_PERIOD = re.compile(r"\bsessions?[\s_-]+\d+|\bthis session\b", re.IGNORECASE)


def scanned_files() -> list[Path]:
    import subprocess

    files: set[Path] = set()
    try:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = {ROOT / n for n in tracked.decode().split("\0") if n}
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout: the project's folders
        for pattern in SCANNED:
            for p in ROOT.glob(pattern):
                files.update(f for f in (p.rglob("*") if p.is_dir() else [p]) if f.is_file())
        files |= {f for f in (ROOT / "effrag").rglob("*") if f.is_file()}
    return sorted(f for f in files if f.is_file() and f.suffix.lower() not in BINARY_SUFFIXES
                  and "__pycache__" not in f.parts and f.resolve() != Path(__file__).resolve())


def offences(pattern: re.Pattern) -> list[str]:
    found = []
    for f in scanned_files():
        rel = f.relative_to(ROOT).as_posix()
        data = f.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if n == 1 and line.startswith("#!"):
                continue  # an interpreter line (#!/usr/bin/env bash) is the same on every machine
            m = pattern.search(line)
            if m:
                found.append(f"{rel}:{n}: ...{line[max(0, m.start() - 40):m.end() + 40]}...")
    return found


def test_the_scan_sees_the_package_data_and_the_docs():
    rel = {f.relative_to(ROOT).as_posix() for f in scanned_files()}
    assert {"README.md", "checkpoints/README.md", "docs/architecture.md", "effrag/pretrained/efficientrag-all/README.md",
            "effrag/pretrained/efficientrag-all/labeler/effrag_config.json", "reports/reader/README.md",
            "checkpoints/efficientrag-all/labeler/effrag_config.json", "scripts/train_efficientrag.sh",
            "tests/helpers.py", "pyproject.toml"} <= rel
    assert not any(r.endswith(".safetensors") for r in rel)
    assert ABSOLUTE_PATH.search("output_dir: /work/main/runs/x") and ABSOLUTE_PATH.search('["/tmp/a/b"]')
    assert not ABSOLUTE_PATH.search("https://x.org/home/a <data>/hotpotqa/dev.jsonl runs/tmp/x ~/.cache/effrag")
    assert WORK_PERIOD.search("until session 15:") and WORK_PERIOD.search("session-3 data")
    assert WORK_PERIOD.search("not in this session") and not WORK_PERIOD.search("a requests.Session()")


def test_no_absolute_machine_path_in_shipped_or_committed_text():
    found = offences(ABSOLUTE_PATH)
    assert not found, (f"{len(found)} line(s) hold an absolute path of a machine (record repo-relative or "
                       "<data>/... paths: effrag.provenance.portable_path):\n" + "\n".join(found[:40]))


def test_no_numbered_work_periods_in_the_project_text():
    found = offences(WORK_PERIOD)
    assert not found, (f"{len(found)} line(s) date something by a work session (give the date, the commit or the "
                       "report instead):\n" + "\n".join(found[:40]))


def test_portable_paths_name_a_root_never_this_machine():
    from effrag.provenance import portable_path, portable_text

    roots = {"/srv/data": "<data>", "/home/u/effrag": "", "/tmp": "<tmp>"}
    assert portable_path("/srv/data/hotpotqa/dev.jsonl", roots) == "<data>/hotpotqa/dev.jsonl"
    assert portable_path("/home/u/effrag/runs/train/x", roots) == "runs/train/x"
    assert portable_path("/opt/models/e5", roots) == "<elsewhere>/e5" and portable_path("runs/a", roots) == "runs/a"
    assert (portable_text("python /home/u/effrag/train.py --data /srv/data/a.jsonl 2>/dev/null; see https://x.org/tmp/a",
                          roots) == "python train.py --data <data>/a.jsonl 2>/dev/null; see https://x.org/tmp/a")
