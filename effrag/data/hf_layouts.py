"""The Hugging Face ``datasets`` layouts of HotpotQA, 2WikiMultihopQA and MuSiQue, read as the originals.

What ``load_dataset(...)`` gives users, and what they save with ``save_to_disk`` or export to
parquet / JSONL / Arrow, differs from the original files in a few columns:

========================  =====================================================================
HotpotQA (``hotpot_qa``,  ``id`` (not ``_id``); ``context = {"title": [...], "sentences": [[...]]}``;
distractor / fullwiki)    ``supporting_facts = {"title": [...], "sent_id": [...]}``; ``type``, ``level``
2WikiMultihopQA           as HotpotQA, ``_id`` or ``id``, the sentences under ``sentences`` or
                          ``content``; ``evidences`` as ``[[s, r, o], ...]``, a list of
                          ``{"fact", "relation", "entity"}`` or a dict of those lists
MuSiQue                   the original columns; ``paragraphs`` / ``question_decomposition`` as a
                          list of dicts or (a ``Sequence`` feature) a dict of lists
========================  =====================================================================

:func:`to_original` turns one such record into the original layout, so the one parser per
dataset in :mod:`effrag.data.loaders` reads both and the same question becomes the same
:class:`~effrag.data.Question` (same gold passages, same corpus ids). Records already in the
original layout pass through unchanged. A wrong column raises ``_RecordError`` naming it
(``context.sentences``, ``supporting_facts.sent_id[3]``).

:func:`table_records` reads the containers: a ``datasets.Dataset`` / ``DatasetDict`` object, a
``save_to_disk`` folder, a ``.parquet`` or ``.arrow`` file. ``datasets`` / ``pyarrow`` are
imported only here, only when such a source is read.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DataFormatError, _RecordError

TABLE_SUFFIXES = (".parquet", ".arrow")
INSTALL_HINT = "pip install 'effrag[datasets]' (or: pip install datasets)"

# columns each layout needs (either name of a pair will do), for errors that name the missing one
REQUIRED = {
    "hotpotqa": [("id", "_id"), ("question",), ("answer",), ("context",), ("supporting_facts",)],
    "2wikimqa": [("_id", "id"), ("question",), ("answer",), ("context",), ("supporting_facts",), ("evidences",)],
    "musique": [("id",), ("question",), ("answer",), ("paragraphs",), ("question_decomposition",)],
}


def _error(fieldname: str, msg: str) -> Exception:
    return _RecordError(fieldname, msg)


def _type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


# ---------------------------------------------------------------- one record
def _rows(value: Any, name: str, keys: tuple[str, ...]) -> list[dict]:
    """A list-of-dicts column, also when stored as a dict of lists (``Sequence`` of a struct)."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise _error(f"{name}[{i}]", f"expected an object, got {_type(item)}")
        return value
    if not isinstance(value, dict):
        raise _error(name, f"expected a list of objects or an object of lists, got {_type(value)}")
    cols = {}
    for k, v in value.items():
        if not isinstance(v, list):
            raise _error(f"{name}.{k}", f"expected list, got {_type(v)}")
        cols[k] = v
    for k in keys:
        if k not in cols:
            raise _error(f"{name}.{k}", "missing")
    n = {len(v) for v in cols.values()}
    if len(n) > 1:
        raise _error(name, "its lists differ in length: " + ", ".join(f"{k}={len(v)}" for k, v in cols.items()))
    size = n.pop() if n else 0
    return [{k: v[i] for k, v in cols.items()} for i in range(size)]


def _list(d: dict, name: str, key: str) -> list:
    if key not in d:
        raise _error(f"{name}.{key}", "missing")
    if not isinstance(d[key], list):
        raise _error(f"{name}.{key}", f"expected list, got {_type(d[key])}")
    return d[key]


def _wiki_to_original(rec: dict) -> dict:
    out = dict(rec)
    if "_id" not in out and "id" in out:
        out["_id"] = out.pop("id")
    ctx = rec.get("context")
    if isinstance(ctx, dict):
        titles = _list(ctx, "context", "title")
        key = "sentences" if "sentences" in ctx or "content" not in ctx else "content"
        sents = _list(ctx, "context", key)
        if len(titles) != len(sents):
            raise _error("context", f"{len(titles)} titles for {len(sents)} '{key}' lists")
        for i, (t, s) in enumerate(zip(titles, sents)):
            if not isinstance(t, str):
                raise _error(f"context.title[{i}]", f"expected str, got {_type(t)}")
            if not isinstance(s, list) or not all(isinstance(x, str) for x in s):
                raise _error(f"context.{key}[{i}]", "expected a list of strings")
        out["context"] = [[t, list(s)] for t, s in zip(titles, sents)]
    sup = rec.get("supporting_facts")
    if isinstance(sup, dict):
        titles, ids = _list(sup, "supporting_facts", "title"), _list(sup, "supporting_facts", "sent_id")
        if len(titles) != len(ids):
            raise _error("supporting_facts", f"{len(titles)} titles for {len(ids)} sent_id values")
        for i, (t, s) in enumerate(zip(titles, ids)):
            if not isinstance(t, str):
                raise _error(f"supporting_facts.title[{i}]", f"expected str, got {_type(t)}")
            if not isinstance(s, int) or isinstance(s, bool):
                raise _error(f"supporting_facts.sent_id[{i}]", f"expected int, got {_type(s)}")
        out["supporting_facts"] = [[t, s] for t, s in zip(titles, ids)]
    ev = rec.get("evidences")
    if ev is not None and not (isinstance(ev, list) and all(isinstance(e, list) for e in ev)):
        rows = _rows(ev, "evidences", ("fact", "relation", "entity"))
        out["evidences"] = [[r.get("fact"), r.get("relation"), r.get("entity")] for r in rows]
    return out


def _musique_to_original(rec: dict) -> dict:
    out = dict(rec)
    if "paragraphs" in rec:
        out["paragraphs"] = _rows(rec["paragraphs"], "paragraphs", ("idx", "title", "paragraph_text"))
    if "question_decomposition" in rec:
        out["question_decomposition"] = _rows(rec["question_decomposition"], "question_decomposition",
                                              ("question", "answer"))
    return out


def to_original(rec: dict, dataset: str) -> dict:
    """``rec`` in the original layout of ``dataset`` (unchanged when it already is)."""
    if dataset in ("hotpotqa", "2wikimqa"):
        return _wiki_to_original(rec)
    if dataset == "musique":
        return _musique_to_original(rec)
    return rec


def missing_columns(keys: set[str]) -> tuple[str, list[str]] | None:
    """The layout ``keys`` come closest to and the columns it lacks, if at least two of its columns are there."""
    best = None
    for name, req in REQUIRED.items():
        have = sum(any(k in keys for k in alts) for alts in req)
        missing = [alts[0] for alts in req if not any(k in keys for k in alts)]
        if have >= 2 and missing and (best is None or have > best[0]):
            best = (have, name, missing)
    return (best[1], best[2]) if best else None


# ---------------------------------------------------------------- containers
def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError(f"reading a Hugging Face dataset needs the datasets package: {INSTALL_HINT}") from None
    return datasets


def is_hf_object(obj: Any) -> bool:
    """A ``datasets.Dataset``/``DatasetDict``/``IterableDataset`` (without importing ``datasets``)."""
    return type(obj).__module__.split(".")[0] == "datasets"


def _pick_split(dd: Any, split: str | None, label: str) -> tuple[Any, str]:
    splits = list(dd.keys())
    if split is not None:
        if split not in dd:
            raise ValueError(f"{label}: no split {split!r}; splits: {', '.join(splits)}")
        return dd[split], f"{label}/{split}"
    if len(splits) == 1:
        return dd[splits[0]], f"{label}/{splits[0]}"
    how = (f"split={splits[-1]!r} or dataset_dict[{splits[-1]!r}]" if label.startswith("<")
           else f"the split's folder, e.g. {label}/{splits[-1]}")
    raise ValueError(f"{label} is a DatasetDict with splits {', '.join(splits)}: choose one ({how})")


def _iter_dataset(ds: Any, label: str) -> Iterator[tuple[str, Any]]:
    for start in range(0, len(ds), 1000):
        batch = ds[start:start + 1000]
        for i, row in enumerate(_columns_to_rows(batch)):
            yield f"{label}[{start + i}]", row


def _columns_to_rows(batch: dict[str, list]) -> list[dict]:
    names = list(batch)
    n = len(batch[names[0]]) if names else 0
    return [{k: batch[k][i] for k in names} for i in range(n)]


def _iter_arrow_table_file(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path.suffix} files needs pyarrow: {INSTALL_HINT}") from None
    try:
        if path.suffix == ".parquet":
            batches = pq.ParquetFile(path).iter_batches(batch_size=1000)
        else:
            src = pa.memory_map(str(path))  # stays open while its (zero-copy) batches are read
            try:
                reader = pa.ipc.open_stream(src)  # what datasets writes (save_to_disk, cache files)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(pa.memory_map(str(path)))
            batches = iter(reader.read_all().to_batches(1000))
    except (pa.ArrowInvalid, OSError) as e:
        raise DataFormatError(f"{path}: not a readable {path.suffix[1:]} file ({e})") from None
    n = 0
    for b in batches:
        for row in b.to_pylist():
            yield f"{path}[{n}]", row
            n += 1


def table_records(source: Any, split: str | None = None) -> tuple[str, list[str], Iterator[tuple[str, Any]]]:
    """``(label, column names, (location, record) iterator)`` of a Hugging Face object or file/folder.

    ``source``: a ``Dataset``/``DatasetDict`` (``split`` picks one of a dict's splits), a
    ``save_to_disk`` folder (of a Dataset, of a DatasetDict, or one split folder of it), or a
    ``.parquet`` / ``.arrow`` file. Folders are memory-mapped, never read whole.
    """
    if is_hf_object(source):
        label = f"<{type(source).__name__}>"
        if hasattr(source, "keys"):
            source, label = _pick_split(source, split, label)
        if not hasattr(source, "__len__"):
            raise TypeError(f"{label}: an IterableDataset has no length; pass a Dataset (or list(...) of its rows)")
        return label, list(source.column_names), _iter_dataset(source, label)
    path = Path(source)
    if path.is_dir():
        if not ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            raise FileNotFoundError(f"{path} is a folder but not a saved Hugging Face dataset "
                                    "(no state.json or dataset_dict.json from save_to_disk)")
        datasets = _import_datasets()
        ds = datasets.load_from_disk(str(path))  # memory-mapped Arrow
        label = str(path)
        if hasattr(ds, "keys"):
            ds, label = _pick_split(ds, split, label)
        return label, list(ds.column_names), _iter_dataset(ds, label)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading .parquet files needs pyarrow: {INSTALL_HINT}") from None
        names = pq.ParquetFile(path).schema_arrow.names
        return str(path), list(names), _iter_arrow_table_file(path)
    return str(path), [], _iter_arrow_table_file(path)


def to_hf(rec: dict, dataset: str, *, struct_of_lists: bool = False) -> dict:
    """The inverse of :func:`to_original`: an original record in the Hugging Face layout.

    For tests and exports (nothing is downloaded here, so HF-layout data is made from real
    original records). HotpotQA gets ``id`` and adds ``type``/``level`` columns if absent, 2Wiki
    keeps ``_id`` and stores ``evidences`` as ``{fact, relation, entity}`` lists; MuSiQue's
    list-of-dict columns become dicts of lists with ``struct_of_lists`` (a ``Sequence`` feature).
    """
    out = dict(rec)
    if dataset in ("hotpotqa", "2wikimqa"):
        if dataset == "hotpotqa":
            out["id"] = out.pop("_id")
            out.setdefault("type", None)
            out.setdefault("level", None)
        out["context"] = {"title": [c[0] for c in rec["context"]], "sentences": [list(c[1]) for c in rec["context"]]}
        out["supporting_facts"] = {"title": [f[0] for f in rec["supporting_facts"]],
                                   "sent_id": [f[1] for f in rec["supporting_facts"]]}
        if dataset == "2wikimqa":
            out["evidences"] = {k: [e[i] for e in rec["evidences"]] for i, k in enumerate(("fact", "relation", "entity"))}
    elif dataset == "musique" and struct_of_lists:
        for col in ("paragraphs", "question_decomposition"):
            rows = rec[col]
            keys = list(dict.fromkeys(k for r in rows for k in r))
            out[col] = {k: [r.get(k) for r in rows] for k in keys}
    return out
