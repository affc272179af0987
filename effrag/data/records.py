"""Typed records shared by every part of effrag.

A dataset file in any supported original format (HotpotQA, 2WikiMultihopQA,
MuSiQue, Bamboogle, StrategyQA) becomes a list of :class:`Question`; a corpus
is a list of :class:`Passage`. Passage ids are content hashes
(:func:`passage_id`), so the same paragraph gets the same id whichever file
or build order it came from, and mapping gold passages to corpus ids is a
lookup rather than a fuzzy match.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any


def normalize_space(s: str) -> str:
    return " ".join(s.split())


def passage_id(title: str, text: str) -> str:
    """Deterministic corpus id of a passage: sha1 of normalised title and text."""
    key = normalize_space(title) + "\n" + normalize_space(text)
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:16]


@dataclass
class Passage:
    """One retrievable chunk. ``sentences`` is kept when the source has it (HotpotQA/2Wiki)."""

    id: str
    title: str
    text: str
    sentences: list[str] | None = None

    @classmethod
    def make(cls, title: str, text: str, sentences: list[str] | None = None) -> Passage:
        return cls(id=passage_id(title, text), title=title, text=text, sentences=sentences)

    def to_json(self) -> dict[str, Any]:
        """Corpus JSONL row (``id, title, text``)."""
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass
class SubQuestion:
    """One hop of a decomposition.

    ``passage`` is the index into ``Question.gold`` of the supporting passage
    (None when unknown); ``dependencies`` are indices of earlier sub-questions
    whose answers this one needs (MuSiQue's ``#1``).
    """

    question: str
    answer: str
    passage: int | None = None
    dependencies: list[int] = field(default_factory=list)


@dataclass
class Question:
    """A multi-hop question in one typed shape, whatever its source format.

    ``gold`` lists the supporting passages in hop order; ``supporting_sentences``
    (same length as ``gold`` when present) lists the supporting sentence indices
    of each gold passage (HotpotQA/2Wiki). ``evidences`` holds 2Wiki's
    (subject, relation, object) triples and ``answer_id`` its answer's Wikidata id
    (``Q...``), the key of the v1.1 alias file (:mod:`effrag.data.aliases`).
    """

    id: str
    dataset: str
    question: str
    answers: list[str]
    gold: list[Passage] = field(default_factory=list)
    contexts: list[Passage] = field(default_factory=list)
    decomposition: list[SubQuestion] = field(default_factory=list)
    supporting_sentences: list[list[int]] | None = None
    evidences: list[tuple[str, str, str]] = field(default_factory=list)
    type: str | None = None
    answer_id: str | None = None

    @property
    def answer(self) -> str:
        return self.answers[0] if self.answers else ""

    @property
    def gold_ids(self) -> list[str]:
        return [p.id for p in self.gold]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
