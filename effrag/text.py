"""Word tokenisation shared by synthesis, training and inference.

Labels live on *words*, not model sub-tokens, so a model with any tokenizer can
be trained from the same files (as LLMLingua-2 does). Words are the tokens of
``spacy.blank("en")`` (rule-based, no model download); whitespace tokens are dropped.
"""
from __future__ import annotations

from functools import lru_cache


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
