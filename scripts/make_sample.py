"""Regenerate the bundled sample in effrag/data/sample from a full data directory.

Usage: python scripts/make_sample.py ../shared/data [--out effrag/data/sample]

Copies the first N lines of each file byte for byte (original formats), so the
sample is a verbatim prefix of the source data. README.md in the output folder
(sources, licenses, citations) is kept, not regenerated.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from effrag.cli_args import DATASETS, add_output_arg

# (dataset, split) -> number of records
COUNTS = {
    **{(d, split): n for d in DATASETS for split, n in (("train", 60), ("dev", 30))},
    ("bamboogle", "dev"): 10,
    ("strategyqa", "dev"): 10,
}


def copy_head(src: Path, dst: Path, n: int) -> int:
    """Copy the first ``n`` non-empty lines of ``src`` to ``dst`` unchanged; returns lines written."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with src.open("rb") as fin, dst.open("wb") as fout:
        for line in fin:
            if written >= n:
                break
            if not line.strip():
                continue
            fout.write(line if line.endswith(b"\n") else line + b"\n")
            written += 1
    if written < n:
        raise SystemExit(f"{src}: only {written} records, need {n}")
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path, help="folder with <dataset>/<split>.jsonl files")
    add_output_arg(ap, Path(__file__).resolve().parents[1] / "effrag/data/sample", dest="out",
                   help="the sample folder")
    args = ap.parse_args(argv)
    for (ds, split), n in COUNTS.items():
        src = args.data_dir / ds / f"{split}.jsonl"
        if not src.is_file():
            raise SystemExit(f"missing {src}")
        copy_head(src, args.out / ds / f"{split}.jsonl", n)
        print(f"{ds}/{split}.jsonl: {n} records")


if __name__ == "__main__":
    main()
