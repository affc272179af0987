"""Word tokenisation and the model-input formats shared by synthesis, training and inference.

Labels live on *words*, not model sub-tokens, so a model with any tokenizer can
be trained from the same files (as LLMLingua-2 does). Words are the tokens of
``spacy.blank("en")`` (rule-based, no model download); whitespace tokens are dropped.

What the Labeler and the Filter read is defined here once (:func:`chunk_text`,
:func:`filter_input_words`): ``data_synthesis`` writes training records with these
functions and the inference loop builds its inputs with them, so the two cannot drift.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

INFO = ["Info", ":"]  # words opening each known-information block of the Filter input


@lru_cache(maxsize=1)
def _nlp():
    import spacy

    return spacy.blank("en")


def words(text: str) -> list[str]:
    """The words of ``text`` in order, without whitespace tokens."""
    return [t.text for t in _nlp().make_doc(text) if not t.is_space]


def words_batch(texts: list[str]) -> list[list[str]]:
    return [[t.text for t in doc if not t.is_space] for doc in _nlp().tokenizer.pipe(texts)]


def join_words(ws: list[str]) -> str:
    """Readable text from a word list (a space between words, none before closing punctuation)."""
    out: list[str] = []
    for w in ws:
        if out and w in {".", ",", ";", ":", "!", "?", ")", "]", "'s", "%"}:
            out[-1] += w
        elif out and out[-1] in {"(", "["}:
            out[-1] += w
        else:
            out.append(w)
    return " ".join(out)


def chunk_text(title: str, text: str, chunk_format: str = "title_text") -> str:
    """What a chunk looks like to the Labeler: ``"<title>: <text>"`` (the paper's document format), or text only."""
    return f"{title}: {text}" if chunk_format == "title_text" and title else text


def passage_text(passage) -> str:
    """:func:`chunk_text` of a :class:`effrag.data.records.Passage` (or anything with ``title`` and ``text``)."""
    return chunk_text(passage.title, passage.text)


def filter_input_words(query: str, kept: Sequence[Sequence[str]]) -> list[str]:
    """Filter input ``"<query> Info: <kept words 1> Info: <kept words 2> ..."`` as words.

    Built part by part (not by re-tokenising the joined string) so that the ``Info :``
    markers sit at known places.
    """
    out = words(query)
    for ws in kept:
        out += INFO + list(ws)
    return out
