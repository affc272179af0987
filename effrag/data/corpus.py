"""The retrieval corpus: an ordered, id-unique collection of :class:`Passage`.

Corpora built from dataset files use content-hash ids (:func:`passage_id`), so
a paragraph shared by several questions or files appears once. A user corpus
(JSONL ``id, title, text``) may use its own ids, or leave ``id`` out to get the
content hash too; :func:`map_gold` then finds gold passages by content hash,
through an index built once per corpus.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .loaders import DataFormatError, load_questions, utf8_error
from .records import Passage, Question, passage_id


class CorpusError(ValueError):
    """A corpus cannot be built or does not hold what it must."""


class Corpus:
    """Passages in a fixed order, unique by id.

    The order is part of the corpus (retrieval indices store row positions), so
    :meth:`fingerprint` covers ids and texts in order.
    """

    def __init__(self, passages: Iterable[Passage]):
        self._passages: list[Passage] = []
        self._by_id: dict[str, int] = {}
        for p in passages:
            if p.id in self._by_id:
                raise CorpusError(f"duplicate passage id {p.id!r} (title {p.title!r})")
            self._by_id[p.id] = len(self._passages)
            self._passages.append(p)
        if not self._passages:
            raise CorpusError("corpus is empty: no passages to retrieve from")
        self._content_index: dict[str, str] | None = None

    # ------------------------------------------------------------ building
    @classmethod
    def from_questions(cls, questions: Iterable[Question]) -> Corpus:
        """Pool every question's context passages, first occurrence wins."""
        seen: dict[str, Passage] = {}
        for q in questions:
            for p in q.contexts:
                seen.setdefault(p.id, p)
        if not seen:
            raise CorpusError("corpus is empty: the questions have no context passages "
                              "(Bamboogle and StrategyQA ship none; give a corpus file instead)")
        return cls(seen.values())

    @classmethod
    def from_jsonl(cls, path: str | Path) -> Corpus:
        """Read a corpus JSONL with one ``{"id", "title", "text"}`` object per line.

        ``id`` may be a string or an integer (kept as its string form), or absent: the passage then gets
        its content hash (:func:`passage_id`, as the project's own corpora), and a record repeating an
        earlier one's title and text is left out. ``title`` may be absent (empty title). Duplicate given
        ids are an error naming both lines.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        passages: list[Passage] = []
        first_line: dict[str, int] = {}
        offset = 0
        with path.open("rb") as f:  # bytes, decoded per line: a bad byte is reported with its line
            for n, raw in enumerate(f, start=1):
                line_offset, offset = offset, offset + len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise utf8_error(path, raw, e, line_no=n, line_offset=line_offset) from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFormatError(f"{path}:{n}: invalid JSON: {e.msg} (column {e.colno})") from None
                if not isinstance(row, dict):
                    raise DataFormatError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
                pid = row.get("id")
                if "id" in row and (isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == ""):
                    raise DataFormatError(f"{path}:{n}: field 'id': expected a non-empty string or integer "
                                          "(or no 'id': the passage's content hash)")
                text, title = row.get("text"), row.get("title", "")
                if not isinstance(text, str) or not text.strip():
                    raise DataFormatError(f"{path}:{n}: field 'text': "
                                          + ("missing" if "text" not in row else "expected a non-empty string"))
                if not isinstance(title, str):
                    raise DataFormatError(f"{path}:{n}: field 'title': expected a string")
                if "id" not in row:  # a user's own records: the content hash, a repeated passage once
                    pid = passage_id(title, text)
                    if pid in first_line:  # the same title and text (up to whitespace) as an earlier record
                        continue
                pid = str(pid)
                if pid in first_line:
                    raise DataFormatError(f"{path}:{n}: field 'id': duplicate id {pid!r} (first on line {first_line[pid]})")
                first_line[pid] = n
                passages.append(Passage(id=pid, title=title, text=text))
        if not passages:
            raise CorpusError(f"{path}: corpus is empty")
        return cls(passages)

    def save(self, path: str | Path) -> Path:
        """Write JSONL rows ``id, title, text`` (sentences are not kept)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for p in self._passages:
                f.write(json.dumps(p.to_json(), ensure_ascii=False) + "\n")
        return path

    # ------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._passages)

    def __getitem__(self, pid: str) -> Passage:
        try:
            return self._passages[self._by_id[pid]]
        except KeyError:
            raise KeyError(f"passage id {pid!r} not in corpus ({len(self)} passages)") from None

    def __contains__(self, pid: object) -> bool:
        return pid in self._by_id

    def __iter__(self) -> Iterator[Passage]:
        return iter(self._passages)

    @property
    def passages(self) -> list[Passage]:
        return list(self._passages)

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self._passages]

    def position(self, pid: str) -> int:
        """Row of ``pid`` in corpus order (the row number retrieval indices use)."""
        return self._by_id[pid]

    def fingerprint(self) -> str:
        """Short sha1 over ids and texts in order: changes if any passage or the order changes."""
        h = hashlib.sha1()
        for p in self._passages:
            h.update(p.id.encode("utf-8") + b"\0" + p.text.encode("utf-8") + b"\n")
        return h.hexdigest()[:16]

    def content_index(self) -> dict[str, str]:
        """``passage_id(title, text)`` of each row -> that row's corpus id (first row wins)."""
        if self._content_index is None:
            index: dict[str, str] = {}
            for p in self._passages:
                index.setdefault(passage_id(p.title, p.text), p.id)
            self._content_index = index
        return self._content_index

    def __repr__(self) -> str:
        return f"Corpus({len(self)} passages, fingerprint={self.fingerprint()})"


def build_corpus(paths: Sequence[str | Path], dataset: str | None = None, *, skip_malformed: bool = False) -> Corpus:
    """Pool the context passages of dataset files (e.g. train and dev) into one corpus.

    ``skip_malformed`` leaves out records :func:`load_questions` would reject, as synthesis does
    with its questions, so one bad line is skipped the same way with or without negatives.
    """
    questions: list[Question] = []
    for p in paths:
        questions.extend(load_questions(p, dataset, skip_malformed=skip_malformed))
    return Corpus.from_questions(questions)


@dataclass
class GoldReport:
    """Gold passages :func:`map_gold` could not find: ``(question id, title)`` pairs."""

    total: int = 0
    missing: list[tuple[str, str]] = field(default_factory=list)

    def counted_as_missed(self, questions: Sequence[Question], gold: list[list[str]]) -> list[list[str]]:
        """``gold`` with a ``"missing:<title>"`` id per passage not in the corpus: never retrieved, so recall counts it."""
        by_q: dict[str, list[str]] = {}
        for qid, title in self.missing:
            by_q.setdefault(qid, []).append(f"missing:{title}")
        return [g + by_q.get(q.id, []) for q, g in zip(questions, gold)]


def map_gold(questions: Sequence[Question], corpus: Corpus, *, report: bool = False):
    """Corpus ids of each question's gold passages, in hop order.

    A gold passage is found by its content hash, so this works both for corpora
    built from dataset files and for user corpora with their own ids (matched by
    identical title and text up to whitespace). Raises :class:`CorpusError` when
    some gold passage is missing, unless ``report=True``, which returns
    ``(ids, GoldReport)`` with the missing ones left out of ``ids``.
    """
    index = corpus.content_index()
    out: list[list[str]] = []
    rep = GoldReport()
    for q in questions:
        ids = []
        for p in q.gold:
            rep.total += 1
            cid = index.get(p.id) or index.get(passage_id(p.title, p.text))
            if cid is None:
                rep.missing.append((q.id, p.title))
            else:
                ids.append(cid)
        out.append(ids)
    if rep.missing and not report:
        n_q = len({qid for qid, _ in rep.missing})
        shown = "; ".join(f"{qid}: {title!r}" for qid, title in rep.missing[:5])
        raise CorpusError(f"{len(rep.missing)} of {rep.total} gold passages ({n_q} questions) not found "
                          f"in corpus of {len(corpus)} passages; e.g. {shown}")
    return (out, rep) if report else out
