"""Align extracted words to the words of a source text: one binary label per source word.

An LLM asked to "extract the words of this paragraph" should return an
order-preserving subsequence of it, but it paraphrases casing, quotes and dashes,
reorders, repeats and sometimes invents words. As in LLMLingua-2 we recover word
labels by alignment rather than trusting the output:

1. Both sides are compared on a normal form: NFKC, curly quotes -> straight, all
   dashes -> "-", then (per word) casefold and accents stripped. Each side is
   tokenised with the same spaCy words after the character mapping, so "1892–1975"
   (one spaCy word) and "1892-1975" (three words) align.
2. In-order pass: each extracted word is searched in a sliding window after the
   previous match; among candidates the one starting the longest run of following
   extracted words wins (so a repeated "the" or "Nike" is labeled where the
   extraction actually continues), ties go to the earliest. A word outside the
   window is accepted further on only if it anchors a run of >= 2 words.
3. Fallback pass: extracted words left over (reordered output) take the nearest
   unlabeled occurrence anywhere, forward first.

Punctuation is labeled when matched in order near the previous match, never by the
fallback, and is not counted in the report. :func:`align` returns the labels with
an :class:`Alignment` report (matched fraction, unmatched words, duplicates) so
callers can reject poorly aligned LLM output; :func:`align_words` returns labels only.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

from effrag.text import words as _words

_CHAR_MAP = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "`": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u00ab": '"', "\u00bb": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
    "\u2015": "-", "\u2212": "-", "\u00ad": "",
})
DEFAULT_WINDOW = 30
_RUN_CAP = 6  # lookahead length when choosing between candidate occurrences


def normalize_chars(text: str) -> str:
    """NFKC plus straight quotes and ASCII dashes (applied before tokenising)."""
    return unicodedata.normalize("NFKC", text).translate(_CHAR_MAP)


# Letters that NFKD does not decompose into base letter + accent.
_LETTERS = str.maketrans({"ł": "l", "ø": "o", "đ": "d", "ð": "d", "æ": "ae", "œ": "oe", "ı": "i", "þ": "th"})


@lru_cache(maxsize=1 << 18)
def word_key(word: str) -> str:
    """Comparison key of one word: casefolded, accents stripped."""
    decomposed = unicodedata.normalize("NFKD", word.casefold().translate(_LETTERS))
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def is_punct(word: str) -> bool:
    return not any(c.isalnum() for c in word)


@dataclass
class Alignment:
    """Labels plus how well the extraction matched the source."""

    labels: list[int]
    matched: int = 0        # extracted (non-punctuation) words that got a source word
    in_order: int = 0       # of those, matched by the in-order pass
    duplicates: int = 0     # repeated words whose every occurrence was already labeled
    unmatched: list[str] = field(default_factory=list)  # extracted words not in the source

    @property
    def total(self) -> int:
        """Extracted non-punctuation words, duplicates excluded."""
        return self.matched + len(self.unmatched)

    @property
    def fraction(self) -> float:
        """Matched share of the extracted words (1.0 for an empty extraction)."""
        return self.matched / self.total if self.total else 1.0

    def to_json(self) -> dict:
        return {"matched": self.matched, "in_order": self.in_order, "duplicates": self.duplicates,
                "unmatched": self.unmatched, "fraction": round(self.fraction, 4)}


def _source_units(words: list[str]) -> tuple[list[str], list[int]]:
    """Keys of the source's normalised sub-words and the source word index of each."""
    keys: list[str] = []
    owner: list[int] = []
    for i, w in enumerate(words):
        mapped = normalize_chars(w)
        parts = [mapped] if mapped == w else (_words(mapped) or [mapped])
        for p in parts:
            keys.append(word_key(p))
            owner.append(i)
    return keys, owner


def _extracted_keys(extracted: str | list[str]) -> list[str]:
    text = extracted if isinstance(extracted, str) else " ".join(extracted)
    return [word_key(w) for w in _words(normalize_chars(text))]


def align(words: list[str], extracted: str | list[str], *, window: int = DEFAULT_WINDOW) -> Alignment:
    """Label each of ``words`` 1 if it is part of ``extracted``; see the module doc."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    src, owner = _source_units(words)
    ext = _extracted_keys(extracted)
    src_words = [c for c in range(len(src)) if not is_punct(src[c])]  # positions of real words
    rank = {c: r for r, c in enumerate(src_words)}                    # source position -> word rank
    ext_words = [i for i in range(len(ext)) if not is_punct(ext[i])]
    taken = [False] * len(src)
    pos: dict[int, int] = {}  # extracted index -> source position
    report = Alignment(labels=[0] * len(words))

    def run_length(k: int, c: int) -> int:
        """How many extracted words from the k-th on match source words from position c on."""
        n, r = 0, rank[c]
        while (n < _RUN_CAP and k + n < len(ext_words) and r + n < len(src_words)
               and not taken[src_words[r + n]] and src[src_words[r + n]] == ext[ext_words[k + n]]):
            n += 1
        return n

    def best(k: int, lo: int, hi: int, min_run: int) -> int | None:
        choice, choice_run = None, min_run - 1
        for c in src_words[lo:hi]:
            if not taken[c] and src[c] == ext[ext_words[k]]:
                r = run_length(k, c)
                if r > choice_run:
                    choice, choice_run = c, r
        return choice

    def take(i: int, c: int) -> None:
        taken[c] = True
        pos[i] = c
        report.labels[owner[c]] = 1

    pointer = 0  # word rank after the last in-order match
    deferred: list[tuple[int, int]] = []
    for k, i in enumerate(ext_words):
        c = best(k, pointer, pointer + window, 1)
        if c is None:
            c = best(k, pointer + window, len(src_words), 2)  # re-anchor after a long skip
        if c is None:
            deferred.append((i, src_words[pointer] if pointer < len(src_words) else len(src)))
            continue
        take(i, c)
        pointer = rank[c] + 1
        report.matched += 1
        report.in_order += 1

    for i, at in deferred:
        order = list(range(at, len(src))) + list(range(at - 1, -1, -1))
        c = next((c for c in order if not taken[c] and src[c] == ext[i]), None)
        if c is not None:
            take(i, c)
            report.matched += 1
        elif ext[i] in src:
            report.duplicates += 1
        else:
            report.unmatched.append(ext[i])

    # Punctuation: only right after the previous or right before the next matched word.
    for i in range(len(ext)):
        if not is_punct(ext[i]):
            continue
        prev = next((pos[j] for j in range(i - 1, -1, -1) if j in pos), None)
        nxt = next((pos[j] for j in range(i + 1, len(ext)) if j in pos), None)
        for c in ([prev + 1] if prev is not None else []) + ([nxt - 1] if nxt is not None else []):
            if 0 <= c < len(src) and not taken[c] and src[c] == ext[i]:
                take(i, c)
                break
    return report


def align_words(words: list[str], extracted: str | list[str], *, window: int = DEFAULT_WINDOW) -> list[int]:
    """One 0/1 label per word of ``words``: 1 where the word is part of ``extracted``."""
    return align(words, extracted, window=window).labels


# ------------------------------------------------------------------ content-word matching
# Shared by the annotation path: which words carry meaning, and when two words are "the same".

# spaCy stop words that carry meaning in multi-hop questions (ordinals, comparisons, "became").
_MEANINGFUL = {
    "first", "third", "last", "next", "former", "formerly", "latter", "before", "after", "more", "most",
    "less", "least", "same", "became", "become", "becomes", "made", "make", "name", "top", "bottom",
    "back", "front", "full", "side", "part", "show", "call", "move", "empty", "serious", "under", "over",
    "one", "two", "three", "four", "five", "six", "eight", "nine", "ten", "eleven", "twelve", "fifteen",
    "twenty", "forty", "fifty", "sixty", "hundred", "alone", "together", "used",
}
WH_WORDS = frozenset({"what", "which", "who", "whom", "whose", "when", "where", "why", "how"})


def _stopwords() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(word_key(normalize_chars(w)) for w in STOP_WORDS) - _MEANINGFUL


STOPWORDS = _stopwords()


@lru_cache(maxsize=1 << 18)
def is_content(word: str) -> bool:
    """A word that carries meaning: not punctuation, not a stop word ("US" is not "us")."""
    if is_punct(word):
        return False
    return word_key(normalize_chars(word)) not in STOPWORDS or (word.isupper() and len(word) > 1)


def content_keys(ws: list[str]) -> set[str]:
    """Comparison keys of the content words among ``ws``."""
    return {word_key(normalize_chars(w)) for w in ws if is_content(w)}


def key_matches(key: str, keys: set[str]) -> bool:
    """Equal, or a shared prefix of >= 4 chars covering all but the last 3 chars of the shorter
    word: a cheap lemmatiser ("directed"~"director", "countries"~"country", not "born"~"birth")."""
    if key in keys:
        return True
    if len(key) < 4:
        return False
    for k in keys:
        n = min(len(k), len(key))
        if n >= 4 and key[:4] == k[:4]:
            need = max(4, n - 3)
            if key[:need] == k[:need]:
                return True
    return False
