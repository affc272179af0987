"""Reading and validating the synthesis JSONL files, and turning them into padded batches.

Formats (docs/design.md): Labeler records ``{query, chunk_words, labels, tag, ...}``,
Filter records ``{words, labels, ...}``. A bad record is an error naming the file,
the line and the field; nothing is silently dropped.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler

from ..models.tokenization import pad_batch


class RecordError(ValueError):
    pass


def _check_words_labels(rec: dict, words_key: str, loc: str) -> None:
    words, labels = rec.get(words_key), rec.get("labels")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise RecordError(f"{loc}: field {words_key!r} must be a list of strings")
    if not isinstance(labels, list) or not all(lab in (0, 1) and not isinstance(lab, float) for lab in labels):
        raise RecordError(f"{loc}: field 'labels' must be a list of 0/1")
    if len(words) != len(labels):
        raise RecordError(f"{loc}: field 'labels' has {len(labels)} entries for {len(words)} {words_key}")


def check_labeler_record(rec: dict, loc: str) -> None:
    if not isinstance(rec.get("query"), str) or not rec["query"].strip():
        raise RecordError(f"{loc}: field 'query' must be a non-empty string")
    _check_words_labels(rec, "chunk_words", loc)
    if rec.get("tag") not in (0, 1) or isinstance(rec.get("tag"), (bool, float)):
        raise RecordError(f"{loc}: field 'tag' must be 0 (<Terminate>) or 1 (<Continue>), got {rec.get('tag')!r}")


def check_filter_record(rec: dict, loc: str) -> None:
    _check_words_labels(rec, "words", loc)


def check_utf8(path: str | Path) -> None:
    """A :class:`RecordError` ``FILE:LINE: not UTF-8 (...)`` at the first line that does not decode.

    ``train.py`` runs it on every JSONL data file before the model loads or the output folder is made.
    """
    from ..data.loaders import utf8_error

    path = Path(path)
    offset = 0
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(str(utf8_error(path, line, e, line_no=n, line_offset=offset))) from None
            offset += len(line)


def read_jsonl(path: str | Path, check: Callable[[dict, str], None]) -> list[dict]:
    """All records of a JSONL file, each validated by ``check(record, "file:line")``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data file not found: {path}")
    try:
        return _read_records(path, check)
    except UnicodeDecodeError:
        check_utf8(path)  # names the line
        raise


def _read_records(path: Path, check: Callable[[dict, str], None]) -> list[dict]:
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            loc = f"{path}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{loc}: invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise RecordError(f"{loc}: expected a JSON object")
            check(rec, loc)
            out.append(rec)
    if not out:
        raise RecordError(f"{path}: no records")
    return out


def select(records: list[dict], sources: list[str] | None, limit: int | None, seed: int) -> list[dict]:
    """Filter by ``source`` and take a seeded random subset of at most ``limit`` records."""
    if sources:
        records = [r for r in records if r.get("source") in sources]
    if limit is not None and len(records) > limit:
        rng = random.Random(seed)
        keep = sorted(rng.sample(range(len(records)), limit))
        records = [records[i] for i in keep]
    return records


class FeatureDataset(Dataset):
    """A list of feature dicts (already tokenized) as a map-style dataset."""

    def __init__(self, features: list[dict], groups: list[str] | None = None):
        self.features = features
        self.groups = groups or []  # names for the integer "group" field (e.g. dataset per record)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict:
        return self.features[i]


class Collator:
    """Pads token fields (labels with -100) and stacks scalar fields."""

    def __init__(self, pad_token_id: int, pad_values: dict | None = None):
        self.pad_token_id = pad_token_id
        self.pad_values = pad_values or {}

    def __call__(self, features: list[dict]) -> dict:
        return pad_batch(features, self.pad_token_id, self.pad_values)


class LengthGroupedSampler(Sampler):
    """Random order of batches whose members have similar lengths (less padding, ~2x faster on CPU).

    Indices are shuffled, cut into mega-batches of ``batch_size * mega`` and sorted by length
    inside each; the resulting batches are shuffled again (the short final batch stays last so
    batch boundaries line up with ``BatchSampler``). The order depends only on ``seed`` and the
    epoch (``set_epoch``), so a resumed run replays it exactly.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, mega: int = 50):
        self.lengths, self.batch_size, self.seed, self.mega = lengths, batch_size, seed, mega
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        """All the order depends on (saved in a checkpoint; the position inside an epoch is the loop's)."""
        return {"seed": self.seed, "epoch": self.epoch, "batch_size": self.batch_size, "mega": self.mega}

    def load_state_dict(self, state: dict) -> None:
        """The saved order (a changed batch size is reported by the loop as a changed setting)."""
        self.seed, self.epoch, self.mega = state["seed"], state["epoch"], state.get("mega", self.mega)

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        size = self.batch_size * self.mega
        batches = []
        for i in range(0, len(order), size):
            mb = sorted(order[i : i + size], key=lambda j: -self.lengths[j])
            batches += [mb[k : k + self.batch_size] for k in range(0, len(mb), self.batch_size)]
        tail = [b for b in batches if len(b) < self.batch_size]
        full = [b for b in batches if len(b) == self.batch_size]
        perm = torch.randperm(len(full), generator=g).tolist()
        for b in [full[p] for p in perm] + tail:
            yield from b


def group_ids(records: list[dict], key: str = "dataset") -> tuple[list[int], list[str]]:
    """Integer group per record (by ``key``, e.g. dataset) and the group names, for per-group metrics."""
    names = sorted({str(r.get(key, "all")) for r in records})
    index = {n: i for i, n in enumerate(names)}
    return [index[str(r.get(key, "all"))] for r in records], names
