"""IRRR's dynamic oracle for search queries (Qi et al., 2021, section 3.4.1).

No dataset annotates search queries, so IRRR derives them: the oracle query for a
target paragraph ``t`` is a set of *spans* of the reasoning path (question +
paragraphs so far) that also occur in ``t``. Spans are maximal runs of words shared
with ``t`` ("David Dunn" is taken or dropped whole). With ``N`` spans, instead of the
``2^N`` subsets the oracle scores each span by

    Imp(s_i) = Rank(t, {s_j}_{j != i}) - Rank(t, {s_i})

(how much the others lose without it, and how well it does alone), sorts spans by
importance and adds them one by one while the rank of ``t`` keeps improving: ``O(N)``
searches. ``Rank`` is the 1-based position of ``t`` when the spans, joined, are the
query; it is computed exactly from the engine's score of every passage (so ``t``
need not be in any top k).

A path is a list of *segments* of words: the question, then title and text of each
paragraph (see :func:`path_segments`); labels come back per segment and word, which
is what IRRR's query head is trained on.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from effrag.text import QUERY_STOPWORDS, normalize_word, words

MAX_SPAN = 8  # longest span (in words) considered; longer shared runs are split


def path_segments(question: str, path: Sequence[dict]) -> list[list[str]]:
    """``[question words, title_1 words, text_1 words, ...]`` for a path of ``{"title", "text"}`` dicts."""
    segs = [words(question)]
    for p in path:
        segs += [words(p["title"]), words(p["text"])]
    return segs


@dataclass
class Span:
    text: str  # normalised words joined by spaces (the query term)
    occurrences: list[tuple[int, int, int]] = field(default_factory=list)  # (segment, start, end) in words


@dataclass
class OracleQuery:
    target: str  # passage id
    spans: list[str]  # chosen spans, in the order they were added
    rank: int  # rank of the target for the chosen query (1 = top)
    labels: list[list[int]]  # per segment, per word: 1 if the word belongs to a chosen span
    n_candidates: int  # overlapping spans considered

    @property
    def query(self) -> str:
        return " ".join(self.spans)


def _ngrams(tokens: list[str], n_max: int) -> set[tuple[str, ...]]:
    out = set()
    for i in range(len(tokens)):
        if not tokens[i]:
            continue
        for n in range(1, n_max + 1):
            gram = tuple(tokens[i : i + n])
            if len(gram) < n or not gram[-1]:
                break
            out.add(gram)
    return out


def overlapping_spans(segments: list[list[str]], target_words: list[str], max_span: int = MAX_SPAN) -> list[Span]:
    """Maximal runs of path words (greedy longest match, left to right) that also occur in the target.

    Words are compared by ``normalize_word`` (punctuation, normalised to '', breaks a span); spans
    of ``QUERY_STOPWORDS`` only are dropped; the same span text found in several places is one
    span with several occurrences.
    """
    grams = _ngrams([normalize_word(w) for w in target_words], max_span)
    spans: dict[str, Span] = {}
    for si, seg in enumerate(segments):
        toks = [normalize_word(w) for w in seg]
        i = 0
        while i < len(toks):
            best = 0
            for n in range(1, max_span + 1):
                gram = tuple(toks[i : i + n])
                if len(gram) < n or not gram[-1] or gram not in grams:
                    break
                best = n
            if best == 0:
                i += 1
                continue
            gram = toks[i : i + best]
            if not all(t in QUERY_STOPWORDS for t in gram):
                key = " ".join(gram)
                spans.setdefault(key, Span(key)).occurrences.append((si, i, i + best))
            i += best
    return list(spans.values())


def make_rank_fn(bm25, position: Callable[[str], int]) -> Callable[[str, str], int]:
    """``rank(target_id, query)`` from a retriever with ``scores(query)`` (all passages, corpus order)."""

    def rank(target: str, query: str) -> int:
        s = bm25.scores(query)
        t = float(s[position(target)])
        if t <= 0.0:
            return len(s) + 1  # shares no term with the query: never retrieved
        return int((s > t).sum()) + 1

    return rank


def oracle_query(segments: list[list[str]], target_id: str, target_words: list[str],
                 rank: Callable[[str, str], int], max_span: int = MAX_SPAN) -> OracleQuery:
    """The dynamic-oracle query for ``target_id`` from the path ``segments`` (see module doc)."""
    spans = overlapping_spans(segments, target_words, max_span)
    labels = [[0] * len(seg) for seg in segments]
    if not spans:
        return OracleQuery(target_id, [], rank(target_id, ""), labels, 0)
    texts = [s.text for s in spans]
    if len(spans) == 1:
        order = [0]
    else:
        imp = [rank(target_id, " ".join(texts[:i] + texts[i + 1 :])) - rank(target_id, texts[i])
               for i in range(len(texts))]
        order = sorted(range(len(texts)), key=lambda i: (-imp[i], i))
    chosen: list[int] = []
    best = None
    for i in order:
        r = rank(target_id, " ".join(texts[j] for j in chosen + [i]))
        if best is not None and r >= best:
            break  # the target's rank stopped improving
        chosen.append(i)
        best = r
    for i in chosen:
        for si, a, b in spans[i].occurrences:
            for w in range(a, b):
                labels[si][w] = 1
    return OracleQuery(target_id, [texts[i] for i in chosen], int(best), labels, len(spans))
