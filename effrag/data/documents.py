"""A user's own documents as a retrieval corpus: folders of ``.txt`` / ``.md`` files and plain passage records.

The project's corpora come from dataset files, whose questions carry their context paragraphs. A user
has documents instead. ``effrag corpus build --inputs`` and ``effrag index build --corpus`` take them
here, so that a folder of notes becomes an index in one command:

- a folder: every ``.txt`` and ``.md`` file under it (sorted by path), split into paragraphs at blank
  lines; consecutive short paragraphs are merged and long ones split (at sentence ends when it can) so
  that each passage has at most ``max_words`` words, and a Markdown heading starts a new passage. A passage's title is its file's name without the
  suffix, plus ``(part N)`` when the file gave several passages (the title is read with the text by every
  model, as a dataset's article title is); a file whose name is not UTF-8 cannot give a title and is skipped,
  with a warning naming it (its bytes escaped, ``caf\\xe9.txt``);
- a JSONL of ``{"title"?, "text"}`` records (``id`` optional: :meth:`Corpus.from_jsonl`);
- a dataset file, as before (its questions' context paragraphs).

Every passage without an id of its own gets its content hash (:func:`~.records.passage_id`), as the
project's corpora do, so the same paragraph indexed twice is one passage.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from .corpus import Corpus, CorpusError, build_corpus
from .loaders import DataFormatError, detect_format, utf8_error
from .records import Passage

DOCUMENT_SUFFIXES = (".txt", ".md")
DEFAULT_MAX_WORDS = 200  # about a Wikipedia paragraph of the bundled datasets, well inside MiniLM's 256 tokens
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
log = logging.getLogger(__name__)


def document_files(folder: str | Path) -> list[Path]:
    """The ``.txt`` / ``.md`` files under ``folder``, sorted by their path inside it."""
    folder = Path(folder)
    return sorted((p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_SUFFIXES),
                  key=lambda p: p.relative_to(folder).as_posix())


def is_document_folder(path: str | Path) -> bool:
    """A folder of text files (not a Hugging Face dataset folder, which holds Arrow or parquet files)."""
    path = Path(path)
    if not path.is_dir() or any(path.rglob("*.arrow")) or any(path.rglob("*.parquet")):
        return False
    return bool(document_files(path))


def paragraphs(text: str) -> list[str]:
    """The paragraphs of ``text``: blocks between blank lines, each one's lines joined by single spaces."""
    return [" ".join(block.split()) for block in _BLANK_LINE.split(text.replace("\r\n", "\n")) if block.strip()]


def _pieces(paragraph: str, max_words: int) -> list[str]:
    """``paragraph`` cut into pieces of at most ``max_words`` words, at sentence ends where a sentence fits."""
    out: list[str] = []
    current: list[str] = []
    for sentence in _SENTENCE_END.split(paragraph):
        words = sentence.split()
        if len(words) > max_words:  # a sentence longer than a passage: cut at the word limit (one pass, linear)
            if current:
                out.append(" ".join(current))
                current = []
            full = (len(words) - 1) // max_words * max_words  # what the old word-by-word cut moved to out
            out += [" ".join(words[i: i + max_words]) for i in range(0, full, max_words)]
            words = words[full:]
        if current and len(current) + len(words) > max_words:
            out.append(" ".join(current))
            current = []
        current += words
    if current:
        out.append(" ".join(current))
    return out


def split_passages(text: str, max_words: int = DEFAULT_MAX_WORDS) -> list[str]:
    """The passages of one document: its paragraphs, short neighbours merged (joined by a blank line) and
    long ones split, each of at most ``max_words`` words; a Markdown heading (``# ...``) starts a new one."""
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    out: list[str] = []
    current: list[str] = []
    size = 0
    for para in paragraphs(text):
        heading = para.startswith("#")  # a Markdown heading opens a passage: it belongs to what follows it
        for piece in _pieces(para, max_words):
            n = len(piece.split())
            if current and (size + n > max_words or heading):
                out.append("\n\n".join(current))
                current, size = [], 0
            current.append(piece)
            size += n
    if current:
        out.append("\n\n".join(current))
    return out


def folder_passages(folder: str | Path, max_words: int = DEFAULT_MAX_WORDS) -> list[Passage]:
    """The passages of every text file under ``folder`` (see the module's docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"documents folder not found: {folder}")
    files = document_files(folder)
    if not files:
        raise CorpusError(f"{folder}: no {' or '.join(DOCUMENT_SUFFIXES)} files in it")
    passages: list[Passage] = []
    unnamed = []
    for f in files:
        if not utf8_name(f.name):  # its title (the name) cannot be written: it stopped the whole build, naming no file
            unnamed.append(f)
            log.warning("%s: skipped: its file name is not UTF-8 (a passage's title is its file name); rename it "
                        "to index it", printable_path(f))
            continue
        raw = f.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise utf8_error(f, raw, e) from None
        parts = split_passages(text, max_words)
        for i, part in enumerate(parts, start=1):
            passages.append(Passage.make(f.stem if len(parts) == 1 else f"{f.stem} (part {i})", part))
    if not passages:
        skipped = f" ({len(unnamed)} skipped: their names are not UTF-8)" if unnamed else ""
        raise CorpusError(f"{printable_path(folder)}: its {len(files)} text file(s) hold no text{skipped}")
    return passages


def utf8_name(name: str) -> bool:
    """Whether a file name read from disk is UTF-8: Python gives the bytes of any other name as lone surrogates
    (``caf\\udce9.txt`` for ``caf\\xe9.txt``), which no JSON, hash or print of the title can encode."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_path(path: str | Path) -> str:
    """``path`` for a message, its bytes that are not UTF-8 written ``\\xe9``: printing the name itself would fail."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def is_passage_file(path: str | Path) -> bool:
    """A JSONL of passage records (``text`` and optional ``title``/``id``) rather than a dataset file: its
    first record has ``text`` and none of a dataset's fields."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in (".jsonl", ".json"):
        return False
    with path.open("rb") as f:
        first = next((line for line in f if line.strip()), b"")
    try:
        record = json.loads(first)
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(record, dict) or "text" not in record:
        return False
    try:
        detect_format(record)
    except DataFormatError:
        return True
    return False


def open_documents(path: str | Path, max_words: int = DEFAULT_MAX_WORDS) -> Corpus:
    """A corpus from a documents folder or a passage JSONL (``effrag index build --corpus``)."""
    if Path(path).is_dir():
        return Corpus(_unique(folder_passages(path, max_words)))
    return Corpus.from_jsonl(path)


def corpus_from_inputs(paths: Sequence[str | Path], dataset: str | None = None,
                       max_words: int = DEFAULT_MAX_WORDS) -> Corpus:
    """One corpus from documents folders, passage JSONL files and dataset files, in the order given (a
    passage met twice is kept once, where it first appeared)."""
    passages: list[Passage] = []
    for p in paths:
        if is_document_folder(p):
            passages += folder_passages(p, max_words)
        elif is_passage_file(p):
            passages += Corpus.from_jsonl(p).passages
        else:
            passages += build_corpus([p], dataset).passages
    return Corpus(_unique(passages))


def _unique(passages: list[Passage]) -> list[Passage]:
    first: dict[str, Passage] = {}
    for p in passages:
        first.setdefault(p.id, p)
    return list(first.values())
