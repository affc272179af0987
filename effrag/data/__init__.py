"""Datasets, corpora and the bundled sample.

``load_questions`` reads HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle and
StrategyQA files in their original formats, and the first three also in their Hugging
Face ``datasets`` layouts (saved folders, parquet/JSONL/Arrow exports, ``Dataset``
objects; ``hf_layouts.py``, docs/datasets.md); ``Corpus`` / ``build_corpus`` pool
their paragraphs into a retrieval corpus; ``map_gold`` gives each question's gold
passages as corpus ids. A small real sample of each dataset ships with the
package (see ``sample/README.md``) so that everything runs without downloads.
"""
from __future__ import annotations

from pathlib import Path

from .corpus import Corpus, CorpusError, GoldReport, build_corpus, map_gold
from .loaders import DATASETS, DataFormatError, LoadReport, detect_format, load_questions
from .records import Passage, Question, SubQuestion, passage_id

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"


def sample_path(dataset: str, split: str = "dev") -> Path:
    """Path of the bundled sample file ``<dataset>/<split>.jsonl``."""
    path = SAMPLE_DIR / dataset / f"{split}.jsonl"
    if not path.is_file():
        have = sorted(f"{p.parent.name}/{p.stem}" for p in SAMPLE_DIR.glob("*/*.jsonl"))
        raise FileNotFoundError(f"no bundled sample {dataset}/{split}; available: {', '.join(have)}")
    return path


def sample_files(split: str = "dev") -> list[Path]:
    """Every bundled sample file of ``split``, in the order of :data:`DATASETS`."""
    files = [SAMPLE_DIR / d / f"{split}.jsonl" for d in DATASETS]
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(f"no bundled sample files for split {split!r} in {SAMPLE_DIR}")
    return files


def sample_question_ids(datasets, split: str = "dev") -> list[str]:
    """The ids of the bundled sample's questions of ``datasets``: the questions the quickstart shows, which the
    tuning reports leave out of every choice and every figure."""
    return [q.id for d in datasets for q in load_questions(sample_path(d, split))]


__all__ = [
    "Passage", "Question", "SubQuestion", "passage_id",
    "load_questions", "detect_format", "DataFormatError", "LoadReport", "DATASETS",
    "Corpus", "CorpusError", "GoldReport", "build_corpus", "map_gold",
    "sample_path", "sample_files", "sample_question_ids", "SAMPLE_DIR",
]
