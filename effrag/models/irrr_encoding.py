"""IRRR's input layout: ``[CLS] question [SEP] title_1 [CONT] para_1 [SEP] ... title_t [CONT] para_t [SEP]``.

Everything IRRR reads is a *reasoning path*: the question and the paragraphs chosen
so far (for the reader and reranker, plus one candidate paragraph). The input is
built from words (``effrag.text.words``) so query-term labels, which live on words,
map to sub-tokens the same way as for the Labeler: a word's label sits on its first
sub-token. When the path is longer than ``max_length`` the question is capped first,
then every paragraph text is cut to a common length (water-filling), so the newest
paragraph never loses everything to older ones.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..text import normalize_word, words
from .tokenization import IGNORE, check_fast

CONT_TOKEN = "[CONT]"
MAX_TITLE_TOKENS = 24


@dataclass
class PathEncoding:
    input_ids: list[int]
    token_type_ids: list[int]
    segments: list[list[str]]  # [question, title_1, text_1, ...] words
    first: list[list[int]]  # per segment, per word: first sub-token position, -1 if cut
    last: list[list[int]]  # per segment, per word: last sub-token position, -1 if cut
    truncated: int  # words cut away

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.input_ids)

    def token_labels(self, labels: list[list[int]] | None) -> list[int]:
        """Per-token labels: each visible word's label on its first sub-token, IGNORE elsewhere."""
        out = [IGNORE] * len(self.input_ids)
        if labels is None:
            return out
        if len(labels) != len(self.segments):
            raise ValueError(f"{len(labels)} label segments for {len(self.segments)} path segments")
        for seg_labels, firsts, seg in zip(labels, self.first, self.segments):
            if len(seg_labels) != len(seg):
                raise ValueError(f"{len(seg_labels)} labels for a segment of {len(seg)} words: {' '.join(seg)[:80]!r}")
            for lab, pos in zip(seg_labels, firsts):
                if pos >= 0:
                    out[pos] = int(lab)
        return out

    def token_word(self) -> list[tuple[int, int] | None]:
        """Per token: (segment, word) of the word it starts or continues; None for special tokens."""
        out: list[tuple[int, int] | None] = [None] * len(self.input_ids)
        for si, (firsts, lasts) in enumerate(zip(self.first, self.last)):
            for wi, (a, b) in enumerate(zip(firsts, lasts)):
                if a >= 0:
                    for p in range(a, b + 1):
                        out[p] = (si, wi)
        return out


def _cap(lengths: list[int], budget: int) -> int:
    """Largest c with sum(min(L, c)) <= budget (water-filling)."""
    if sum(lengths) <= budget:
        return max(lengths, default=0)
    lo, hi = 0, max(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def encode_path(tokenizer, question: str | list[str], paragraphs: list[dict], max_length: int,
                max_question_tokens: int = 64, segments: list[list[str]] | None = None) -> PathEncoding:
    """Encode a reasoning path (``paragraphs``: ``{"title", "text"}`` dicts, the candidate last).

    ``segments`` (precomputed words of question, titles and texts) skips word splitting.
    """
    check_fast(tokenizer)
    cont = tokenizer.convert_tokens_to_ids(CONT_TOKEN)
    if cont is None or cont == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no {CONT_TOKEN} token: build the model with IRRRModel.from_encoder")
    if segments is None:
        segments = [question if isinstance(question, list) else words(question)]
        for p in paragraphs:
            segments += [words(p["title"]), words(p["text"])]
    enc = tokenizer(segments, is_split_into_words=True, add_special_tokens=False)
    ids = enc["input_ids"]
    wids = [enc.word_ids(i) for i in range(len(segments))]
    n_par = (len(segments) - 1) // 2
    keep = [len(x) for x in ids]
    keep[0] = min(keep[0], max_question_tokens)
    for i in range(n_par):
        keep[1 + 2 * i] = min(keep[1 + 2 * i], MAX_TITLE_TOKENS)
    fixed = 2 + 2 * n_par + keep[0] + sum(keep[1 + 2 * i] for i in range(n_par))
    budget = max(0, max_length - fixed)
    text_lens = [keep[2 + 2 * i] for i in range(n_par)]
    c = _cap(text_lens, budget)
    for i in range(n_par):
        keep[2 + 2 * i] = min(keep[2 + 2 * i], c)

    input_ids = [tokenizer.cls_token_id]
    types = [0]
    first: list[list[int]] = []
    last: list[list[int]] = []
    truncated = 0
    for si, seg in enumerate(segments):
        if si > 0 and si % 2 == 0:
            input_ids.append(cont)
            types.append(1)
        start = len(input_ids)
        input_ids += ids[si][: keep[si]]
        types += [0 if si == 0 else 1] * keep[si]
        f, l = [-1] * len(seg), [-1] * len(seg)
        for t, w in enumerate(wids[si][: keep[si]]):
            if w is None:
                continue
            if f[w] < 0:
                f[w] = start + t
            l[w] = start + t
        # a word whose sub-tokens were cut midway is not visible (its label would be half a word)
        full_words = {w for w in wids[si][: keep[si]] if w is not None}
        if keep[si] < len(ids[si]):
            cut = wids[si][keep[si]]
            if cut is not None and cut in full_words:
                f[cut] = l[cut] = -1
        truncated += sum(1 for x in f if x < 0)
        first.append(f)
        last.append(l)
        if si == 0 or si % 2 == 0:
            input_ids.append(tokenizer.sep_token_id)
            types.append(0 if si == 0 else 1)
    return PathEncoding(input_ids, types, segments, first, last, truncated)


def find_answer(segments: list[list[str]], answer: str, prefer: list[int] | None = None) -> tuple[int, int, int] | None:
    """First occurrence of the answer's words in the path, as (segment, first word, last word).

    Matching ignores case and punctuation-only differences (``effrag.text.normalize_word``, as the
    oracle's); segments in ``prefer`` (e.g. the candidate paragraph) are searched first.
    """
    target = [t for t in (normalize_word(w) for w in words(answer)) if t]
    if not target:
        return None
    order = list(prefer or []) + [i for i in range(len(segments)) if i not in (prefer or [])]
    for si in order:
        toks = [normalize_word(w) for w in segments[si]]
        idx = [i for i, t in enumerate(toks) if t]  # skip punctuation inside the path
        flat = [toks[i] for i in idx]
        n = len(target)
        for j in range(len(flat) - n + 1):
            if flat[j : j + n] == target:
                return si, idx[j], idx[j + n - 1]
    return None
