"""Synthesis output as a Hugging Face ``DatasetDict`` (``effrag synthesize --format arrow|both``).

The JSONL files written by :class:`~effrag.jsonl.ResumableWriter` stay the crash-safe log of a
run: every finished question is appended there first, so a killed run resumes as before. At
the end of a run :func:`export_arrow` writes ``<out>/dataset/`` (``save_to_disk``; splits
``labeler`` and ``filter``, typed columns, memory-mapped when read back) from the records
already in ``dataset/`` plus the questions in the JSONL files that are not in it yet. It
writes ``dataset.tmp/`` and swaps it in, so a kill during the export leaves the old dataset
and the JSONL intact. With ``--format arrow`` the JSONL record files are then emptied (their
records now live in ``dataset/``); ``done.jsonl`` keeps the markers that make a rerun skip
finished questions, and a later run adds its new questions to ``dataset/`` the same way.

``train.py`` reads ``dataset/labeler`` / ``dataset/filter`` (or ``dataset/``, the split named
after the task) as ``data.train_file`` (:mod:`effrag.training.hf_data`).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from effrag.jsonl import item_key, read_jsonl

FORMATS = ("jsonl", "arrow", "both")
SPLITS = ("labeler", "filter")
DATASET_DIR = "dataset"
# the columns synthesis writes, typed once so every export (and every resume) has the same schema
_KNOWN = {"qid": "string", "dataset": "string", "source": "string", "hop": "int64", "query": "string",
          "chunk_id": "string", "chunk_words": ["string"], "words": ["string"], "labels": ["int8"], "tag": "int8",
          "target": "string"}


def _features(keys: dict[str, Any]):
    from datasets import Features, List, Value

    def feat(spec):
        return List(Value(spec[0])) if isinstance(spec, list) else Value(spec)

    return Features({k: feat(spec) for k, spec in keys.items()})


def _infer(value: Any) -> Any:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ["string"]
    return "string"  # anything else is kept as its JSON text


def _existing(out: Path, split: str):
    path = out / DATASET_DIR / split
    if not (path / "state.json").is_file():
        return None
    from datasets import load_from_disk

    return load_from_disk(str(path))


def iter_records(out_dir: str | Path, split: str) -> Iterator[dict[str, Any]]:
    """Every record of ``split``: those in ``dataset/`` and those only in the JSONL log."""
    out = Path(out_dir)
    ds = _existing(out, split)
    seen: set[str] = set()
    if ds is not None:
        for start in range(0, len(ds), 1000):
            batch = ds[start:start + 1000]
            names = list(batch)
            for i in range(len(batch[names[0]])):
                rec = {k: batch[k][i] for k in names if batch[k][i] is not None}
                seen.add(item_key(rec["dataset"], rec["qid"]))
                yield rec
    path = out / f"{split}.jsonl"
    if path.is_file():
        for rec in read_jsonl(path):
            if item_key(rec["dataset"], rec["qid"]) not in seen:
                yield rec


def export_arrow(out_dir: str | Path, *, keep_jsonl: bool = True, progress: bool = True) -> dict[str, int]:
    """Write ``<out_dir>/dataset/`` from the run's records; returns rows per split."""
    try:
        import datasets
    except ImportError:
        raise ImportError("--format arrow/both needs the datasets package: pip install 'effrag[datasets]'") from None
    bars = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        return _export(Path(out_dir), keep_jsonl)
    finally:
        if bars:
            datasets.enable_progress_bars()


def _export(out: Path, keep_jsonl: bool) -> dict[str, int]:
    from datasets import Dataset, DatasetDict
    tmp, final, old = out / f"{DATASET_DIR}.tmp", out / DATASET_DIR, out / f"{DATASET_DIR}.old"
    for stale in (tmp, out / ".hf_cache"):  # left by a killed export: never reused
        shutil.rmtree(stale, ignore_errors=True)
    parts = {}
    for split in SPLITS:
        keys: dict[str, Any] = {}
        for rec in iter_records(out, split):  # pass 1: the columns (the schema must be fixed up front)
            for k, v in rec.items():
                if k not in keys and v is not None:
                    keys[k] = _KNOWN.get(k) or _infer(v)
        if not keys:
            keys = {k: _KNOWN[k] for k in ("qid", "dataset", "source", "hop")}
        features = _features(keys)
        str_cols = {k for k, spec in keys.items() if spec == "string" and k not in _KNOWN}

        def rows(split=split, keys=keys, str_cols=str_cols):
            for rec in iter_records(out, split):
                yield {k: (json.dumps(rec[k]) if k in str_cols and not isinstance(rec.get(k), (str, type(None)))
                           else rec.get(k)) for k in keys}

        cache = out / ".hf_cache"
        parts[split] = Dataset.from_generator(rows, features=features, cache_dir=str(cache), keep_in_memory=False)
    DatasetDict(parts).save_to_disk(str(tmp))
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(out / ".hf_cache", ignore_errors=True)
    if not keep_jsonl:  # the records now live in dataset/; done.jsonl still marks what is finished
        for split in SPLITS:
            path = out / f"{split}.jsonl"
            if path.is_file():
                with path.open("w"):
                    pass
    return {split: len(ds) for split, ds in parts.items()}
