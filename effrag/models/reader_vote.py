"""Several extractive readers answering by majority vote: one reader to every user of a reader.

Readers of different backbones and training lengths err on different questions: on the dev files' oracle
reading the MiniLM reader and the SmolLM2 readers after one and two epochs each score 35-38 F1 pooled, and one
of the three is right far more often than any one alone (``reports/reader/README.md``). Each member reads
the pool as it would alone (its own windows and tuned decoding); the answer most members give (after the
official answer normalisation) wins, and a tie goes to the most confident of the tied answers (the members'
confidence logits ``f``). The winner is returned unchanged, its window and confidence included, so
SearChain's threshold and every report read it as any reader's answer.

A vote folder holds only ``effrag_config.json`` (``model_type: reader_vote``, member folders relative to it,
their file hashes) and a card; the weights stay in the members' own checkpoints. :func:`load_reader` (what
``effrag eval --reader``, SearChain and the reader scripts call) and ``load_model`` open it like a single reader::

    python scripts/build_reader_vote.py --members checkpoints/reader-all checkpoints/reader-smol \\
        checkpoints/reader-smol2 --output checkpoints/reader-vote
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..state_files import write_text_atomic
from .reader import ExtractiveReader, ReaderAnswer, load_reader_checkpoint

VOTE_TYPE = "reader_vote"


def vote(answers: Sequence[ReaderAnswer]) -> int:
    """Index of the winning answer: the most frequent normalised answer, ties to the highest confidence."""
    from ..text import normalize_answer

    if not answers:
        raise ValueError("vote: no answers")
    keys = [normalize_answer(a.answer) for a in answers]
    counts = {k: keys.count(k) for k in keys}
    top = max(counts.values())
    return max((i for i, k in enumerate(keys) if counts[k] == top), key=lambda i: (answers[i].confidence, -i))


class ReaderVote:
    """The readers in ``members`` answering together (:func:`vote`); reads like an :class:`ExtractiveReader`."""

    model_type = VOTE_TYPE

    def __init__(self, members: Sequence[ExtractiveReader], names: Sequence[str] | None = None):
        if len(members) < 2:
            raise ValueError(f"a reader vote needs at least 2 readers, got {len(members)}")
        self.members = list(members)
        self.names = list(names) if names is not None else [f"reader{i}" for i in range(len(members))]
        self.training_config = None

    # -- reading (the ExtractiveReader interface its users call) -----------------------------------------------
    def eval(self) -> ReaderVote:
        for m in self.members:
            m.eval()
        return self

    def read(self, question: str, passages: Sequence[str], together: bool = True, batch_size: int = 16,
             **decoding) -> tuple[ReaderAnswer, list[int]]:
        """Every member reads ``passages`` (:meth:`ExtractiveReader.read`); the voted answer and its window."""
        outs = [m.read(question, passages, together, batch_size, **decoding) for m in self.members]
        return outs[vote([a for a, _ in outs])]

    def predict(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 16,
                **decoding) -> list[ReaderAnswer]:
        """One voted answer per (question, document) pair."""
        per_member = [m.predict(questions, documents, batch_size, **decoding) for m in self.members]
        return [group[vote(group)] for group in zip(*per_member)]

    def decoding(self) -> dict:
        """Each member's span decoding, by member name."""
        return {name: m.decoding() for name, m in zip(self.names, self.members)}

    # -- folder format --------------------------------------------------------------------------------------------
    @staticmethod
    def write(path: str | Path, members: Sequence[str | Path], provenance: dict | None = None) -> dict:
        """Write a vote folder at ``path`` over the reader checkpoints ``members`` (stored relative to it)."""
        from .heads import CONFIG_NAME, read_effrag_config

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        rel, files = [], {}
        for m in members:
            load_member(Path(m), f"--members {m}")  # refuse a bad member now, not at the first question
            r = os.path.relpath(Path(m).resolve(), path.resolve())
            rel.append(r)
            member = read_effrag_config(m)  # its weights' hashes and decoding: a retrained member changes the vote's
            files[r] = {"files": member.get("files"), "options": member.get("options")}
        meta = {"model_type": VOTE_TYPE, "options": {}, "members": rel, "files": files, "vote": "majority of normalised answers; "
                "ties to the highest confidence", **({"provenance": provenance} if provenance else {})}
        write_text_atomic(path / CONFIG_NAME, json.dumps(meta, indent=2) + "\n")
        return meta

    @classmethod
    def from_pretrained(cls, path: str | Path, **_) -> ReaderVote:
        """Open a vote folder: each member loads from its own checkpoint (paths relative to ``path``)."""
        from .heads import CONFIG_NAME, read_effrag_config

        path = Path(path)
        meta = read_effrag_config(path)
        where = path / CONFIG_NAME
        if meta.get("model_type") != VOTE_TYPE:
            raise ValueError(f"{where}: model_type is {meta.get('model_type')!r}, expected {VOTE_TYPE!r}")
        members = meta.get("members")
        if not isinstance(members, list) or len(members) < 2 or not all(isinstance(m, str) for m in members):
            raise ValueError(f"{where}: 'members' must list at least 2 reader folders (relative to {path})")
        readers = [load_member(path / m, f"{where}: members[{i}] {m!r}") for i, m in enumerate(members)]
        vote_ = cls(readers, [Path(m).name for m in members])
        vote_.training_config = meta.get("provenance")
        return vote_


def load_reader(path: str | Path) -> ExtractiveReader | ReaderVote:
    """A reader folder (:class:`ExtractiveReader`), a vote folder (:class:`ReaderVote`), by its
    ``effrag_config.json``, or a shipped reader's name (``reader-all``, :func:`effrag.pretrained.resolve_model`);
    anything else gets :func:`~.reader.load_reader_checkpoint`'s clear error."""
    from effrag.pretrained import resolve_model

    from .heads import CONFIG_NAME, HEADS_NAME, read_effrag_config

    path = resolve_model(path)
    if not (path / HEADS_NAME).is_file() and (path / CONFIG_NAME).is_file() \
            and read_effrag_config(path)["model_type"] == VOTE_TYPE:
        return ReaderVote.from_pretrained(path)
    return load_reader_checkpoint(path)


def load_member(path: Path, where: str) -> ExtractiveReader:
    """One member reader, with an error naming the vote's field when it is missing or not a reader."""
    from .heads import HEADS_NAME

    if not (path / HEADS_NAME).is_file():
        raise FileNotFoundError(f"{where}: no reader checkpoint at {path} (no {HEADS_NAME}; train it with "
                                "`python scripts/train_models.py --models reader --name NAME`)")
    return ExtractiveReader.from_pretrained(path)
