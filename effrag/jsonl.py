"""Resumable, crash-safe JSONL output: synthesis records, IRRR oracle steps, and result rows (:class:`ResultLog`).

The library's one home for "append records per finished item, survive kill -9, resume
where it stopped". Default layout (synthesis; other writers pass ``files=``)::

    labeler.jsonl  filter.jsonl  rejects.jsonl   records, each tagged with qid + dataset
    done.jsonl                                     one marker per finished question

Scheme (so that a question is either fully present or absent after any crash):

* all lines of one question go to each file in ONE ``write`` followed by flush+fsync;
* the question's ``done.jsonl`` marker is written (and fsynced) only AFTER its records;
* on open, every file loses a trailing partial line (a kill -9 mid-write) by being
  truncated to its last newline, and records whose (dataset, qid) has no done marker
  (an item interrupted between its record writes and its marker) are removed by
  rewriting the file whole (:func:`effrag.state_files.atomic_open`).

Questions are processed one after another, so orphans can only be the tail of a
file; filtering the whole file is simply the obviously correct way to drop them.
A rejected question is also "done": its reject line is its only record.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .integrity import writing

FILES = ("labeler", "filter", "rejects")
DONE = "done"

# Test hook: seconds to sleep between an item's record writes and its done marker,
# so that a crash test can reliably kill a run inside that window.
WRITE_DELAY_ENV = "EFFRAG_SYNTH_WRITE_DELAY"


def item_key(dataset: str, qid: str) -> str:
    """Identity of a question across pooled datasets (qids alone may collide)."""
    return f"{dataset}\t{qid}"


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a bad line raises ValueError naming file and line."""
    return (rec for _, rec in numbered_jsonl(path))


def numbered_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of a JSONL file, blank lines skipped: for callers whose own checks of a
    record must name its line too. A line that is not JSON, or not UTF-8, raises ValueError naming file and line
    (a decoding error of the whole file named neither)."""
    path = Path(path)
    if not path.exists():
        return
    offset = 0  # of the line in the file, in bytes
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                from .data.loaders import utf8_error

                raise utf8_error(path, raw, e, line_no=n, line_offset=offset) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: invalid JSON line: {e.msg}") from None


def truncate_partial_line(path: Path) -> int:
    """Cut ``path`` after its last newline (a kill mid-write leaves a torn last line); returns the bytes dropped."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        pos = size
        while pos > 0:  # scan backwards in blocks for the last newline
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return size - keep


def _dumps(rec: dict[str, Any]) -> str:
    return json.dumps(rec, ensure_ascii=False) + "\n"


class ResumableWriter:
    """Append finished questions to ``out_dir``; skip them on a rerun via :attr:`done_ids`."""

    def __init__(self, out_dir: str | Path, *, write_delay: float | None = None, files: tuple[str, ...] = FILES):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.files = tuple(files)
        self.paths = {name: self.out_dir / f"{name}.jsonl" for name in (*self.files, DONE)}
        self.write_delay = float(os.environ.get(WRITE_DELAY_ENV, 0)) if write_delay is None else write_delay
        self.recovered = {"partial_lines": 0, "orphan_records": 0}
        self.done_ids: set[str] = set()
        self._recover()
        self._handles = {name: open(p, "ab") for name, p in self.paths.items()}

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        for p in self.paths.values():
            if p.exists():
                self.recovered["partial_lines"] += int(truncate_partial_line(p) > 0)
        for rec in read_jsonl(self.paths[DONE]):
            self.done_ids.add(item_key(rec["dataset"], rec["qid"]))
        for name in self.files:
            self._drop_orphans(self.paths[name])

    def _drop_orphans(self, path: Path) -> None:
        if not path.exists():
            return
        keep: list[str] = []
        dropped = 0
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if item_key(rec["dataset"], rec["qid"]) in self.done_ids:
                    keep.append(line)
                else:
                    dropped += 1
        if dropped:
            from .state_files import atomic_open

            with atomic_open(path) as f:
                f.writelines(keep)
            self.recovered["orphan_records"] += dropped

    # ------------------------------------------------------------ writing
    def is_done(self, dataset: str, qid: str) -> bool:
        return item_key(dataset, qid) in self.done_ids

    def _append(self, name: str, records: Iterable[dict[str, Any]]) -> int:
        data = "".join(_dumps(r) for r in records).encode("utf-8")
        if data:
            h = self._handles[name]
            with writing(h.name):
                h.write(data)
                h.flush()
                os.fsync(h.fileno())
        return len(data)

    def write_item(self, dataset: str, qid: str, *, labeler: list[dict] = (), filters: list[dict] = (),
                   rejects: list[dict] = (), status: str = "ok", notes: dict | None = None) -> None:
        """Persist every record of one finished question, then its done marker."""
        self.write_records(dataset, qid, {"labeler": labeler, "filter": filters, "rejects": rejects},
                           status=status, notes=notes)

    def write_records(self, dataset: str, qid: str, records: dict[str, Iterable[dict]], *, status: str = "ok",
                      notes: dict | None = None) -> None:
        """Persist one finished question's records (file name -> records), then its done marker."""
        records = {name: list(recs) for name, recs in records.items()}
        unknown = set(records) - set(self.files)
        if unknown:
            raise ValueError(f"no output file(s) {sorted(unknown)} in this writer; files: {list(self.files)}")
        for name, recs in records.items():
            for r in recs:
                if r.get("qid") != qid or r.get("dataset") != dataset:
                    raise ValueError(f"{name} record tagged {r.get('dataset')}/{r.get('qid')} "
                                     f"written for item {dataset}/{qid}")
            self._append(name, recs)
        if self.write_delay:
            time.sleep(self.write_delay)
        marker = {"qid": qid, "dataset": dataset, "status": status,
                  **{name: len(recs) for name, recs in records.items() if name != "rejects"}}
        if notes:
            marker["notes"] = notes
        self._append(DONE, [marker])
        self.done_ids.add(item_key(dataset, qid))

    def close(self) -> None:
        for h in self._handles.values():
            h.close()

    def __enter__(self) -> ResumableWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResultLog:
    """Rows appended as each unit of work finishes, read back by key on a rerun (results, predictions).

    The one home of "a killed run resumes and loses nothing finished" for row-per-item outputs:
    opening cuts a torn last line (a kill mid-write), reads every row under ``key(row)`` (a bad
    line is a ValueError naming the file and line, with ``hint``), and :meth:`append` writes one
    row with flush + fsync. ``where`` keeps only rows it accepts (e.g. rows of the same setup).
    """

    def __init__(self, path: str | Path, key, *, where=None, hint: str = "delete the line to redo it"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.key = key
        self.rows: dict[Any, dict[str, Any]] = {}
        self.torn = bool(self.path.is_file() and truncate_partial_line(self.path))
        if self.path.is_file():
            with self.path.open("rb") as f:
                for n, raw in enumerate(f, start=1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"{self.path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                                         f"{e.start + 1}); {hint}") from None
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        k = key(row)
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        msg = e.msg if isinstance(e, json.JSONDecodeError) else f"not a result row: {e!r}"
                        raise ValueError(f"{self.path}:{n}: invalid JSON ({msg}); {hint}") from None
                    if where is None or where(row):
                        self.rows[k] = row
        self._handle = None

    def __contains__(self, key) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key, default=None):
        return self.rows.get(key, default)

    def append(self, row: dict[str, Any]) -> None:
        self.extend([row])

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        """Write rows in one write, then flush + fsync (a batch is either fully there or cut at a line)."""
        rows = list(rows)
        if not rows:
            return
        if self._handle is None:
            self._handle = self.path.open("ab")
        with writing(self.path):
            self._handle.write("".join(_dumps(r) for r in rows).encode("utf-8"))
            self._handle.flush()
            os.fsync(self._handle.fileno())
        for r in rows:
            self.rows[self.key(r)] = r

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
