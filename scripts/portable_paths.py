"""Rewrite this machine's absolute paths in text files as portable ones, before the files are committed or shipped.

    python scripts/portable_paths.py reports/efficientrag/README.md effrag/pretrained/efficientrag-all/loop-*.json
    python scripts/portable_paths.py --check reports/     # list the lines it would change; exit 1 if any

Run outputs (an eval's ``config.json``, a tuning folder's ``results.jsonl``) record absolute paths on purpose: a
resumed run is matched against them. What is committed must not (``tests/test_cleanliness.py``): a path under the
repository becomes repo-relative, under the data root (``$DATA``, else ``../shared/data``) ``<data>/...``, and
likewise ``<site-packages>/...``, ``<tmp>/...``, ``~/...`` (``effrag.provenance.portable_text``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from effrag.provenance import path_roots, portable_text


def text_files(paths: list[Path]):
    for p in paths:
        for f in (sorted(p.rglob("*")) if p.is_dir() else [p]):
            if f.is_file() and b"\0" not in f.read_bytes()[:8192]:
                yield f


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="files or folders (binary files are skipped)")
    ap.add_argument("--check", action="store_true", help="only list the lines that would change")
    args = ap.parse_args(argv)
    roots, changed = path_roots(), 0
    for f in text_files(args.paths):
        text = f.read_text(encoding="utf-8")
        new = portable_text(text, roots)
        if new == text:
            continue
        changed += 1
        if args.check:
            for n, (a, b) in enumerate(zip(text.splitlines(), new.splitlines()), start=1):
                if a != b:
                    print(f"{f}:{n}: {b[:160]}")
        else:
            f.write_text(new, encoding="utf-8")
            print(f"rewrote {f}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
