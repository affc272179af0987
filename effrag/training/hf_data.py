"""Training data as Hugging Face ``datasets``: memory-mapped Arrow in, tokenised Arrow cache out.

``data.train_file`` (and each of ``data.eval_files``) may be a JSONL file, as before, or Arrow:
a ``save_to_disk`` folder of a ``Dataset``, of a ``DatasetDict`` (the split named after the task
is used: ``labeler``, ``filter``, ...; ``effrag synthesize --format arrow`` writes one) or one
split folder of it, or a ``.arrow`` file. Arrow is memory-mapped, never read whole:

* records are validated by the task's ``check_record`` batch by batch (errors name
  ``<source>[row]`` and the field, as the JSONL path names ``file:line``);
* ``sources`` / ``max_train_examples`` pick the same records as :func:`~.data.select` does on JSONL;
* tokenisation runs once through ``Dataset.map`` into a cache file beside the data, keyed by the
  data's fingerprint, the task, ``max_length`` and the tokenizer's full definition, so a rerun
  (or a resumed run) reads the cached features instead of tokenising again;
* :class:`ArrowFeatures` hands the loop one row at a time from that memory-mapped cache.

So memory stays flat as the data grows (reports/datasets/report.md measures it); only the
per-example lengths (one int each, for length-grouped batches) are held in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset as TorchDataset

from .data import RecordError

LENGTH = "_length"  # the cached feature column holding each example's token count


def is_arrow_source(path: str | Path) -> bool:
    """A ``save_to_disk`` folder or an ``.arrow`` file (anything else is read as JSONL)."""
    p = Path(path)
    return (p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())) or \
        (p.suffix == ".arrow" and p.is_file())


def data_exists(path: str | Path) -> bool:
    return Path(path).is_file() or is_arrow_source(path)


def _datasets():
    try:
        import datasets
    except ImportError:
        from .config import ConfigError  # a data setting the install cannot serve: one line from train.py

        raise ConfigError("Arrow training data needs the datasets package: pip install 'effrag[datasets]'") from None
    return datasets


def open_arrow(path: str | Path, split: str | None = None):
    """The memory-mapped ``datasets.Dataset`` at ``path`` (``split``: the DatasetDict split to use)."""
    datasets = _datasets()
    p = Path(path)
    if p.suffix == ".arrow" and p.is_file():
        return datasets.Dataset.from_file(str(p))
    ds = datasets.load_from_disk(str(p))
    if hasattr(ds, "keys"):
        names = list(ds.keys())
        if split in ds:
            return ds[split]
        if len(names) == 1:
            return ds[names[0]]
        raise RecordError(f"{p}: a DatasetDict with splits {', '.join(names)} and none named {split!r}; "
                          f"give one split folder, e.g. {p / names[0]}")
    return ds


def fingerprint(path: str | Path, split: str | None = None) -> str:
    """The Arrow data's content fingerprint (``datasets``' own), for provenance without hashing every byte."""
    return open_arrow(path, split)._fingerprint


def _rows(batch: dict[str, list]) -> list[dict]:
    names = list(batch)
    n = len(batch[names[0]]) if names else 0
    return [{k: batch[k][i] for k in names} for i in range(n)]


def read_arrow_records(path: str | Path, check: Callable[[dict, str], None], split: str | None = None) -> list[dict]:
    """All records of an Arrow source as dicts, each validated (for the small eval files)."""
    ds = open_arrow(path, split)
    out: list[dict] = []
    for start in range(0, len(ds), 1000):
        for i, rec in enumerate(_rows(ds[start:start + 1000])):
            check(rec, f"{path}[{start + i}]")
            out.append(rec)
    if not out:
        raise RecordError(f"{path}: no records")
    return out


def select_indices(ds, sources: list[str] | None, limit: int | None, seed: int) -> list[int] | None:
    """The rows :func:`~.data.select` would keep (None: all), without materialising the records."""
    keep: list[int] | None = None
    if sources:
        if "source" not in ds.column_names:
            keep = []
        else:
            wanted = set(sources)
            col = ds.with_format(None)["source"]
            keep = [i for i, s in enumerate(col) if s in wanted]
    n = len(ds) if keep is None else len(keep)
    if limit is not None and n > limit:
        picked = sorted(random.Random(seed).sample(range(n), limit))
        keep = picked if keep is None else [keep[i] for i in picked]
    return keep


def _tokenizer_digest(tokenizer) -> str:
    h = hashlib.sha1()
    from effrag.models.tokenization import tokenizer_spec

    h.update(tokenizer_spec(tokenizer).encode("utf-8"))
    h.update(json.dumps(getattr(tokenizer, "init_kwargs", {}), sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()[:16]


class ArrowFeatures(TorchDataset):
    """Tokenised features in a memory-mapped Arrow table, one dict of lists per item."""

    def __init__(self, table, lengths: list[int]):
        self.table = table.with_format(None)
        self.lengths = lengths
        self.columns = [c for c in self.table.column_names if c != LENGTH]

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> dict:
        row = self.table[int(i)]
        return {k: row[k] for k in self.columns}

    def __getitems__(self, indices: list[int]) -> list[dict]:  # one Arrow read per batch
        batch = self.table[[int(i) for i in indices]]
        return [{k: batch[k][j] for k in self.columns} for j in range(len(indices))]


def arrow_features(path: str | Path, *, task_name: str, check: Callable[[dict, str], None],
                   featurize: Callable[[list[dict]], list[dict]], length: Callable[[dict], int], tokenizer,
                   max_length: int, sources: list[str] | None = None, limit: int | None = None, seed: int = 0,
                   cache_dir: str | Path | None = None, num_proc: int | None = None) -> ArrowFeatures:
    """Validate, select and tokenise an Arrow source through a cached ``Dataset.map``.

    ``featurize(records) -> features`` is the task's featurizer bound to its model and max length;
    the cache file is ``<cache_dir or the data's folder>/effrag-<task>-<key>.arrow`` (a temporary folder
    when the data's folder is read-only).
    """
    ds = open_arrow(path, task_name)
    if len(ds) == 0:
        raise RecordError(f"{path}: no records")
    keep = select_indices(ds, sources, limit, seed)
    if keep is not None:
        ds = ds.select(keep)
    key = hashlib.sha1(json.dumps([ds._fingerprint, task_name, max_length, _tokenizer_digest(tokenizer)]).encode())
    key = key.hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir else (
        Path(ds.cache_files[0]["filename"]).parent if ds.cache_files else Path(path).parent)
    if not os.access(folder if folder.exists() else folder.parent, os.W_OK):  # a read-only data folder
        folder = Path(tempfile.gettempdir()) / "effrag-arrow-cache"
    folder.mkdir(parents=True, exist_ok=True)
    cache_file = folder / f"effrag-{task_name}-{key}.arrow"
    origin = list(range(len(ds))) if keep is None else keep

    def tokenize(batch: dict[str, list], idx: list[int]) -> dict[str, list]:
        records = _rows(batch)
        for rec, i in zip(records, idx):
            check(rec, f"{path}[{origin[i]}]")
        feats = featurize(records)
        cols: dict[str, list] = {k: [f[k] for f in feats] for k in feats[0]} if feats else {}
        cols[LENGTH] = [length(f) for f in feats]
        return cols

    table = ds.map(tokenize, batched=True, batch_size=256, with_indices=True, remove_columns=ds.column_names,
                   cache_file_name=str(cache_file), load_from_cache_file=True, new_fingerprint=key,
                   num_proc=num_proc, desc=f"tokenising {task_name}")
    lengths = list(table.with_format(None)[LENGTH])
    return ArrowFeatures(table, [int(n) for n in lengths])


def describe(path: str | Path, split: str | None = None) -> dict[str, Any]:
    """Rows, columns and fingerprint of an Arrow source (for run_info)."""
    ds = open_arrow(path, split)
    return {"rows": len(ds), "columns": ds.column_names, "fingerprint": ds._fingerprint}


def read_records(path: str | Path, check: Callable[[dict, str], None], split: str | None = None) -> list[dict]:
    """Validated records of a JSONL file or an Arrow source (``split``: the DatasetDict split)."""
    from .data import read_jsonl

    return read_arrow_records(path, check, split) if is_arrow_source(path) else read_jsonl(path, check)
