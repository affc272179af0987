"""Word tokenisation and the model-input formats shared by synthesis, training and inference.

Labels live on *words*, not model sub-tokens, so a model with any tokenizer can
be trained from the same files (as LLMLingua-2 does). Words are the tokens of
``spacy.blank("en")`` (rule-based, no model download); whitespace tokens are dropped.

What the Labeler and the Filter read is defined here once (:func:`chunk_text`,
:func:`filter_input_words`): ``data_synthesis`` writes training records with these
functions and the inference loop builds its inputs with them, so the two cannot drift.
"""
from __future__ import annotations

import re
import string
from collections.abc import Sequence
from functools import lru_cache

INFO = ["Info", ":"]  # words opening each known-information block of the Filter input
_NON_ALNUM = re.compile(r"[^0-9a-z]+")
# Words that are never IRRR query terms: the dynamic oracle (data_synthesis.irrr_oracle) drops spans made only
# of these and the trained model's query (effrag.models.irrr) skips them (BM25 ignores them anyway).
QUERY_STOPWORDS = frozenset(
    "a an and are as at be been but by for from had has have he her his i in into is it its of on or she "
    "that the their them there these they this to was were what when where which who whom whose why will "
    "with how did does do than then also after before during its one two".split()
)


@lru_cache(maxsize=1)
def _nlp():
    import spacy

    return spacy.blank("en")


def words(text: str) -> list[str]:
    """The words of ``text`` in order, without whitespace tokens."""
    return [t.text for t in _nlp().make_doc(text) if not t.is_space]


def words_batch(texts: list[str]) -> list[list[str]]:
    return [[t.text for t in doc if not t.is_space] for doc in _nlp().tokenizer.pipe(texts)]


def words_of_each(texts: Sequence[str]) -> list[list[str]]:
    """:func:`words_batch` splitting each distinct text once: a model reads one query beside many chunks, and the
    pairs' queries repeat (equal texts share one word list; do not change it in place)."""
    distinct = list(dict.fromkeys(texts))
    split = dict(zip(distinct, words_batch(distinct)))
    return [split[t] for t in texts]


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


# The extractive reader reads passages as the Labeler reads chunks, packed one per line into a window
PASSAGE_SEPARATOR = "\n"  # between packed passages, in training records and at reading time alike


def reader_passage(title: str, text: str) -> str:
    """How the reader sees one passage: :func:`chunk_text`'s ``"title: text"`` (the title often names the answer's
    entity), the same in its training records (``data_synthesis``) and at reading time."""
    return chunk_text(title, text)


def filter_input_words(query: str, kept: Sequence[Sequence[str]]) -> list[str]:
    """Filter input ``"<query> Info: <kept words 1> Info: <kept words 2> ..."`` as words.

    Built part by part (not by re-tokenising the joined string) so that the ``Info :``
    markers sit at known places.
    """
    out = words(query)
    for ws in kept:
        out += INFO + list(ws)
    return out


def normalize_word(word: str) -> str:
    """Lower-case alphanumerics of a word, '' for punctuation: the form in which words of two texts match.

    IRRR's oracle finds query spans shared by a path and a target with it, and its reader finds
    the answer in a path with it, so training labels and inference agree on what "the same word" is.
    """
    return _NON_ALNUM.sub("", word.lower())


_TRAILING_PARENS = re.compile(r"\s*\([^()]*\)\s*$")


def link_form(text: str) -> str:
    """Lower-case alphanumeric words joined by single spaces and padded with one space each side: the form in
    which a title is looked up in a passage (``" " + link_title(t) + " " in link_form(passage)``)."""
    return " " + " ".join(_NON_ALNUM.sub(" ", text.lower()).split()) + " "


def link_title(title: str) -> str:
    """A title as a passage names it: :func:`link_form` words without a trailing disambiguation in parentheses
    ("Tom Smith (footballer)" is named "Tom Smith"); '' when fewer than 4 characters are left, too short to be a
    name rather than a common word."""
    name = " ".join(_NON_ALNUM.sub(" ", _TRAILING_PARENS.sub("", title or "").lower()).split())
    return name if len(name) >= 4 else ""


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """An answer as the official HotpotQA / SQuAD scripts compare it: lower case, no punctuation, no articles, single
    spaces. Here, not in ``evaluation``, because methods (IRCoT, MCR, the readers) and synthesis compare answers
    too, and ``evaluation`` sits above them."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())
