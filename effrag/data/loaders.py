"""Load multi-hop QA files into :class:`Question` records.

Supported: HotpotQA (distractor), 2WikiMultihopQA, MuSiQue-Ans v1.0, Bamboogle
and StrategyQA, as a JSON array or as JSON Lines, in their original layouts or
(HotpotQA, 2Wiki, MuSiQue) in the Hugging Face ``datasets`` layouts, also as a
``save_to_disk`` folder, a parquet or Arrow file, or a ``Dataset``/``DatasetDict``
object (:mod:`effrag.data.hf_layouts`; docs/datasets.md). The format is detected
from the keys of the first record unless ``dataset=`` is given.

Every problem in a record raises :class:`DataFormatError` naming the file, the
location (1-based line for JSONL, 0-based index for JSON arrays) and the field.
With ``skip_malformed=True`` bad records are skipped, counted in the
:class:`LoadReport` and announced with one warning; nothing is dropped silently.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataFormatError, _RecordError
from .hf_layouts import REQUIRED, TABLE_SUFFIXES, is_hf_object, missing_columns, table_records, to_original
from .records import Passage, Question, SubQuestion

log = logging.getLogger(__name__)

# the three multi-hop datasets with train and dev files: what the recipe trains on, tunes on and reports
MULTIHOP_DATASETS = ("hotpotqa", "2wikimqa", "musique")
DATASETS = ("hotpotqa", "2wikimqa", "musique", "bamboogle", "strategyqa")
_ALIASES = {"hotpot": "hotpotqa", "2wiki": "2wikimqa", "2wikimultihopqa": "2wikimqa",
            "musique-ans": "musique", "musique_ans": "musique"}
_REF = re.compile(r"#(\d+)")


@dataclass
class LoadReport:
    """What :func:`load_questions` did with one file."""

    path: str
    dataset: str
    loaded: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # messages of skipped records
    notes: Counter = field(default_factory=Counter)  # tolerated quirks, e.g. out-of-range sentence ids


# ---------------------------------------------------------------- field access

def _get(rec: dict, name: str, types: type | tuple[type, ...], where: str | None = None) -> Any:
    label = where or name
    if name not in rec:
        raise _RecordError(label, "missing")
    value = rec[name]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        want = "/".join(t.__name__ for t in _as_tuple(types))
        raise _RecordError(label, f"expected {want}, got {type(value).__name__}")
    return value


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _answers(first: Any, aliases: list[Any]) -> list[str]:
    """``[answer] + aliases`` as strings, deduplicated, first occurrence kept."""
    out: list[str] = []
    for a in [first, *aliases]:
        s = str(a).strip()
        if s and s not in out:
            out.append(s)
    return out


def _deps(text: str, upto: int, fieldname: str) -> list[int]:
    """0-based indices of earlier hops referenced as ``#N`` in ``text``."""
    deps = sorted({int(n) - 1 for n in _REF.findall(text)})
    for d in deps:
        if not 0 <= d < upto:
            raise _RecordError(fieldname, f"reference '#{d + 1}' does not name an earlier sub-question")
    return deps


# ---------------------------------------------------------------- formats

def _wiki_style(rec: dict, dataset: str, notes: Counter) -> Question:
    """HotpotQA and 2WikiMultihopQA share ``context`` / ``supporting_facts``."""
    qid = str(_get(rec, "_id", (str, int)))
    joiner = "" if dataset == "hotpotqa" else " "  # HotpotQA sentences carry their leading space
    contexts: list[Passage] = []
    by_title: dict[str, Passage] = {}
    for i, item in enumerate(_get(rec, "context", list)):
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], list) or not all(isinstance(s, str) for s in item[1])):
            raise _RecordError(f"context[{i}]", "expected [title, [sentence, ...]]")
        title, sents = item
        p = Passage.make(title, joiner.join(sents).strip(), [s.strip() for s in sents])
        if any(c.id == p.id for c in contexts):  # 2Wiki repeats some paragraphs verbatim
            notes["duplicate context paragraph dropped"] += 1
            continue
        contexts.append(p)
        by_title.setdefault(title, p)
    gold: list[Passage] = []
    sup: list[list[int]] = []
    for i, fact in enumerate(_get(rec, "supporting_facts", list)):
        if (not isinstance(fact, list) or len(fact) != 2 or not isinstance(fact[0], str)
                or not isinstance(fact[1], int) or isinstance(fact[1], bool)):
            raise _RecordError(f"supporting_facts[{i}]", "expected [title, sentence_index]")
        title, sent = fact
        if title not in by_title:
            raise _RecordError("supporting_facts", f"title {title!r} not in context")
        p = by_title[title]
        if p not in gold:
            gold.append(p)
            sup.append([])
        if not 0 <= sent < len(p.sentences or []):
            notes["supporting sentence index out of range dropped"] += 1  # known 2Wiki quirk
            continue
        if sent not in sup[gold.index(p)]:
            sup[gold.index(p)].append(sent)
    if not gold:
        raise _RecordError("supporting_facts", "empty")
    evidences: list[tuple[str, str, str]] = []
    if dataset == "2wikimqa":
        for i, ev in enumerate(_get(rec, "evidences", list)):
            if not isinstance(ev, list) or len(ev) != 3:
                raise _RecordError(f"evidences[{i}]", "expected [subject, relation, object]")
            evidences.append((str(ev[0]), str(ev[1]), str(ev[2])))
    rtype = rec.get("type")
    answer_id = rec.get("answer_id")  # 2Wiki: Wikidata id of the answer, the key of the v1.1 alias file
    return Question(
        id=qid, dataset=dataset, question=_get(rec, "question", str).strip(),
        answers=_answers(_get(rec, "answer", (str, int, float)), []),
        gold=gold, contexts=contexts, supporting_sentences=[sorted(s) for s in sup],
        evidences=evidences, type=rtype if isinstance(rtype, str) else None,
        answer_id=answer_id if dataset == "2wikimqa" and isinstance(answer_id, str) and answer_id else None,
    )


def _hotpotqa(rec: dict, notes: Counter) -> Question:
    return _wiki_style(rec, "hotpotqa", notes)


def _2wikimqa(rec: dict, notes: Counter) -> Question:
    return _wiki_style(rec, "2wikimqa", notes)


def _musique(rec: dict, notes: Counter) -> Question:
    qid = str(_get(rec, "id", (str, int)))
    by_idx: dict[int, Passage] = {}
    contexts: list[Passage] = []
    for i, para in enumerate(_get(rec, "paragraphs", list)):
        if not isinstance(para, dict):
            raise _RecordError(f"paragraphs[{i}]", "expected an object")
        idx = _get(para, "idx", int, f"paragraphs[{i}].idx")
        title = _get(para, "title", str, f"paragraphs[{i}].title")
        text = _get(para, "paragraph_text", str, f"paragraphs[{i}].paragraph_text")
        if idx in by_idx:
            raise _RecordError(f"paragraphs[{i}].idx", f"duplicate idx {idx}")
        p = Passage.make(title, text.strip())
        by_idx[idx] = p
        if all(c.id != p.id for c in contexts):
            contexts.append(p)
    gold: list[Passage] = []
    decomposition: list[SubQuestion] = []
    steps = _get(rec, "question_decomposition", list)
    if not steps:
        raise _RecordError("question_decomposition", "empty")
    for i, step in enumerate(steps):
        where = f"question_decomposition[{i}]"
        if not isinstance(step, dict):
            raise _RecordError(where, "expected an object")
        sub_q = _get(step, "question", str, f"{where}.question")
        support = step.get("paragraph_support_idx")
        pos: int | None = None
        if support is not None:
            if support not in by_idx:
                raise _RecordError(f"{where}.paragraph_support_idx", f"no paragraph with idx {support!r}")
            if by_idx[support] not in gold:
                gold.append(by_idx[support])
            pos = gold.index(by_idx[support])
        decomposition.append(SubQuestion(
            question=sub_q, answer=str(_get(step, "answer", (str, int, float), f"{where}.answer")),
            passage=pos, dependencies=_deps(sub_q, i, f"{where}.question")))
    aliases = rec.get("answer_aliases") or []
    if not isinstance(aliases, list):
        raise _RecordError("answer_aliases", f"expected list, got {type(aliases).__name__}")
    return Question(
        id=qid, dataset="musique", question=_get(rec, "question", str).strip(),
        answers=_answers(_get(rec, "answer", (str, int, float)), aliases),
        gold=gold, contexts=contexts, decomposition=decomposition,
        type=qid.split("__")[0] if "__" in qid else None,  # e.g. "2hop", "3hop1", "4hop3"
    )


def _bamboogle(rec: dict, notes: Counter) -> Question:
    question = _get(rec, "Question", str).strip()
    # Bamboogle has no ids; a content hash is stable under reordering and sub-sampling.
    qid = "bamboogle-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]
    return Question(id=qid, dataset="bamboogle", question=question,
                    answers=_answers(_get(rec, "Answer", (str, int, float)), []))


def _strategyqa(rec: dict, notes: Counter) -> Question:
    answer = _get(rec, "answer", bool)
    steps = _get(rec, "decomposition", list)
    decomposition = []
    for i, s in enumerate(steps):
        if not isinstance(s, str):
            raise _RecordError(f"decomposition[{i}]", f"expected str, got {type(s).__name__}")
        decomposition.append(SubQuestion(question=s, answer="", passage=None,
                                         dependencies=_deps(s, i, f"decomposition[{i}]")))
    return Question(id=str(_get(rec, "qid", (str, int))), dataset="strategyqa",
                    question=_get(rec, "question", str).strip(),
                    answers=["yes" if answer else "no"], decomposition=decomposition)


_PARSERS: dict[str, Callable[[dict, Counter], Question]] = {
    "hotpotqa": _hotpotqa, "2wikimqa": _2wikimqa, "musique": _musique,
    "bamboogle": _bamboogle, "strategyqa": _strategyqa,
}


def detect_format(record: dict) -> str:
    """Dataset name of a record, from its keys. Raises :class:`DataFormatError` if unknown."""
    keys = set(record) if isinstance(record, dict) else set()
    if {"paragraphs", "question_decomposition"} <= keys:
        return "musique"
    if {"context", "supporting_facts"} <= keys:
        return "2wikimqa" if "evidences" in keys else "hotpotqa"
    if {"Question", "Answer"} <= keys:
        return "bamboogle"
    if {"qid", "question", "decomposition"} <= keys:
        return "strategyqa"
    near = missing_columns(keys)
    hint = (f"; closest: the {near[0]} layout, which lacks column(s) {', '.join(repr(c) for c in near[1])}"
            if near else "")
    raise DataFormatError(
        f"unknown record format with keys {sorted(keys)}; expected one of {', '.join(DATASETS)} "
        f"(pass dataset= to force one){hint}")


def _canonical(dataset: str) -> str:
    name = _ALIASES.get(dataset.lower(), dataset.lower())
    if name not in _PARSERS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}")
    return name


# ---------------------------------------------------------------- reading

def utf8_error(path: Path, data: bytes, err: UnicodeDecodeError, *, line_no: int | None = None,
               line_offset: int = 0) -> DataFormatError:
    """:class:`DataFormatError` ``"FILE:LINE: not UTF-8 (byte 0xff at column C, byte offset O)"``.

    ``data`` is the whole file (``line_no`` None: the line is counted here) or one line of it
    (``line_no`` given, ``line_offset`` its first byte's offset in the file). Columns count
    bytes from 1, like the byte offset counts them from 0, so both point at the bad byte in a
    hex editor or ``cut -b``.
    """
    start = err.start
    if line_no is None:
        line_no = data.count(b"\n", 0, start) + 1
        line_start = data.rfind(b"\n", 0, start) + 1
    else:
        line_start = 0
    bad = data[start:start + 1]
    byte = f"byte 0x{bad[0]:02x}" if bad else "truncated character"
    return DataFormatError(
        f"{path}:{line_no}: not UTF-8 ({byte} at column {start - line_start + 1}, "
        f"byte offset {line_offset + start}); re-save the file as UTF-8")


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(location, record)``: ``"path:LINE"`` for JSONL, ``"path[INDEX]"`` for a JSON array.

    A line that is not valid JSON yields a :class:`DataFormatError` instead of a record,
    so that the caller can skip it like any other malformed record.
    """
    raw = path.read_bytes()
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if raw.lstrip().startswith(b"["):  # one document: the first bad byte stops it
            raise utf8_error(path, raw, e) from None
        text = None  # JSONL: only the lines holding bad bytes are bad records
    if text is not None and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{path}:{e.lineno}: invalid JSON array: {e.msg} (column {e.colno})") from e
        for i, rec in enumerate(data):
            yield f"{path}[{i}]", rec
        return
    # Lines end at "\n" only (not str.splitlines' U+2028 & co., which JSON strings may hold raw).
    lines: list[str] | list[bytes] = text.split("\n") if text is not None else raw.split(b"\n")
    offset = 0  # of the line in the file, in bytes (only needed when the file is not UTF-8)
    for n, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            line_offset, offset = offset, offset + len(line) + 1
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield f"{path}:{n}", utf8_error(path, line, e, line_no=n, line_offset=line_offset)
                continue
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as e:
            yield f"{path}:{n}", DataFormatError(f"{path}:{n}: invalid JSON: {e.msg} (column {e.colno})")


def _source_records(source: Any, split: str | None, name: str | None) -> tuple[str, Iterator[tuple[str, Any]]]:
    """``(label, (location, record) iterator)`` of a JSON/JSONL file or a Hugging Face source."""
    if not is_hf_object(source):
        path = Path(source)
        if not path.is_dir() and path.suffix not in TABLE_SUFFIXES:
            if not path.is_file():
                raise FileNotFoundError(f"dataset file not found: {path}")
            return str(path), _records(path)
        if not path.exists():
            raise FileNotFoundError(f"dataset file not found: {path}")
    label, columns, records = table_records(source, split)
    if columns and name is None:  # a table names its columns up front: say which one is missing
        try:
            name = detect_format(dict.fromkeys(columns))
        except DataFormatError as e:
            raise DataFormatError(f"{label}: {e}") from None
    if columns and name in REQUIRED:
        missing = [alts[0] for alts in REQUIRED[name] if not any(a in columns for a in alts)]
        if missing:
            raise DataFormatError(f"{label}: column(s) {', '.join(repr(c) for c in missing)} missing for "
                                  f"the {name} layout (columns: {', '.join(columns)})")
    return label, records


def load_questions(path: Any, dataset: str | None = None, *, skip_malformed: bool = False,
                   limit: int | None = None, report: bool = False, split: str | None = None):
    """Load a dataset into a list of :class:`Question`.

    ``path`` is a JSON / JSONL file (original or Hugging Face layout), a ``save_to_disk`` folder,
    a ``.parquet`` / ``.arrow`` file, or a ``datasets.Dataset`` / ``DatasetDict`` (``split``
    picks a split of a DatasetDict). ``dataset`` forces a format (``hotpotqa``, ``2wikimqa``,
    ``musique``, ``bamboogle``, ``strategyqa``); by default it is detected from the first
    record. ``limit`` stops after that many questions. With ``report=True`` returns
    ``(questions, LoadReport)``.
    """
    name = _canonical(dataset) if dataset else None
    label, records = _source_records(path, split, name)
    questions: list[Question] = []
    rep = LoadReport(path=label, dataset=name or "")
    seen: dict[str, str] = {}
    for where, rec in records:
        if limit is not None and len(questions) >= limit:
            break
        try:
            if isinstance(rec, DataFormatError):
                raise rec
            if not isinstance(rec, dict):
                raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            if name is None:
                try:
                    name = detect_format(rec)
                except DataFormatError as e:
                    raise DataFormatError(f"{where}: {e}") from None
                rep.dataset = name
            try:
                q = _PARSERS[name](to_original(rec, name), rep.notes)
            except _RecordError as e:
                raise DataFormatError(f"{where}: {e}") from None
            if q.id in seen:
                raise DataFormatError(f"{where}: field 'id': duplicate question id {q.id!r} (first at {seen[q.id]})")
            if not q.answers:
                raise DataFormatError(f"{where}: field 'answer': empty")
            if not q.question.strip():  # would retrieve nothing and count as recall 0
                raise DataFormatError(f"{where}: field 'question': empty or only whitespace")
        except DataFormatError as e:
            if not skip_malformed:
                raise
            rep.skipped += 1
            rep.errors.append(str(e))
            continue
        seen[q.id] = where
        questions.append(q)
    rep.loaded = len(questions)
    if not questions and not rep.skipped and limit != 0:  # no record at all: say that, not "unknown format"
        raise DataFormatError(f"{label}: empty file (no records)")
    if rep.skipped:
        log.warning("%s: skipped %d malformed record(s); first: %s", label, rep.skipped, rep.errors[0])
    for note, count in rep.notes.items():
        log.info("%s: %s: %d", label, note, count)
    return (questions, rep) if report else questions
