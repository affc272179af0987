"""A gold chunk's words for annotation-derived records: their title / sentence positions, content-word keys,
and the kept-word labels (content words matching a step's keys, whole phrases) inside chosen sentences."""
from __future__ import annotations

import re
from collections import Counter

from effrag.data.records import Passage
from effrag.text import passage_text, words

from .align import content_keys, is_content, is_punct, key_matches, normalize_chars, word_key

_SENT = re.compile(r"(?<=[.!?])\s+(?=[\"'“(\[]?[A-Z0-9])")


def text_keys(text: str) -> set[str]:
    """Content-word keys of a text (what matching between questions, answers and chunks compares)."""
    return content_keys(words(text))


def _word_offsets(text: str, ws: list[str]) -> list[int]:
    """Start char of each word (spaCy words are verbatim slices of the text, in order)."""
    out, pos = [], 0
    for w in ws:
        at = text.find(w, pos)
        out.append(at if at >= 0 else pos)
        pos = at + len(w) if at >= 0 else pos
    return out


def _sentence_spans(p: Passage, offset: int) -> list[tuple[int, int]]:
    sents = p.sentences if p.sentences else _SENT.split(p.text)
    spans, pos = [], 0
    for s in sents:
        s = s.strip()
        at = p.text.find(s, pos) if s else -1
        if at < 0:
            spans.append((offset + pos, offset + pos))
            continue
        spans.append((offset + at, offset + at + len(s)))
        pos = at + len(s)
    return spans


class ChunkView:
    """Words of one gold chunk with their title / sentence positions."""

    def __init__(self, p: Passage):
        self.passage = p
        self.text = passage_text(p)
        self.words = words(self.text)
        self.keys = [word_key(normalize_chars(w)) for w in self.words]
        self.content = [is_content(w) for w in self.words]
        offs = _word_offsets(self.text, self.words)
        body = len(p.title) + 2 if p.title else 0
        self.in_title = [o < body - 2 for o in offs]
        self.sentence_of = [-1] * len(self.words)
        spans = _sentence_spans(p, body)
        si = 0
        for i, o in enumerate(offs):  # words and sentences are both in text order
            while si < len(spans) and o >= spans[si][1]:
                si += 1
            if si < len(spans) and spans[si][0] <= o:
                self.sentence_of[i] = si

    def sentences_with(self, keys: set[str], min_share: float = 0.5) -> set[int]:
        """Sentences holding at least ``min_share`` of ``keys``."""
        if not keys:
            return set()
        found: dict[int, set[str]] = {}
        for i, k in enumerate(self.keys):
            if self.sentence_of[i] >= 0 and self.content[i]:
                for want in keys:
                    if key_matches(k, {want}):
                        found.setdefault(self.sentence_of[i], set()).add(want)
        return {s for s, got in found.items() if len(got) >= max(1, min_share * len(keys))}

    def best_sentence(self, keys: set[str], among: set[int] | None = None) -> set[int]:
        """The sentence (of ``among``, if given) with most words matching ``keys``; earliest on ties."""
        if among is not None and not among:
            return set()
        counts = Counter(self.sentence_of[i] for i, k in enumerate(self.keys)
                         if self.sentence_of[i] >= 0 and (among is None or self.sentence_of[i] in among)
                         and self.content[i] and key_matches(k, keys))
        if not counts:
            return {min(among)} if among else set()
        top = max(counts.values())
        return {min(s for s, c in counts.items() if c == top)}

    def label(self, keys: set[str], phrases: list[str], sentences: set[int] | None,
              whole_title: bool = False, anywhere: list[str] = ()) -> list[int]:
        """1 for content words matching ``keys`` and whole occurrences of ``phrases``, inside
        the title or the given sentences (all sentences when None), and for occurrences of the
        ``anywhere`` phrases in the whole chunk."""
        region = [t or sentences is None or s in sentences for t, s in zip(self.in_title, self.sentence_of)]
        labels = [int(r and c and key_matches(k, keys)) for r, c, k in zip(region, self.content, self.keys)]
        if whole_title:  # the title names the entity: keep it whole ("Never Cry Wolf")
            labels = [1 if t and not is_punct(w) else x for t, w, x in zip(self.in_title, self.words, labels)]
        for ph in [*phrases, *anywhere]:
            seq = [word_key(normalize_chars(w)) for w in words(ph)]
            n, free = len(seq), ph in anywhere
            for i in range(len(self.keys) - n + 1 if n else 0):
                if (free or region[i]) and self.keys[i:i + n] == seq:
                    labels[i:i + n] = [1] * n
        return labels


def has_phrase(view: ChunkView, labels: list[int], phrase: str) -> bool:
    """Is at least half of ``phrase``'s content found among the labeled words?"""
    want = text_keys(phrase)
    kept = {k for k, l in zip(view.keys, labels) if l}
    return not want or sum(key_matches(k, kept) for k in want) >= len(want) / 2
