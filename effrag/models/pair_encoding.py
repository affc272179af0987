"""Inference inputs ``[CLS] query [SEP] chunk [SEP]`` built from chunk sub-tokens computed once per chunk.

The loop reads each chunk several times: the pool ranker reads it, the Labeler reads the best of them, later hops
re-read it under new queries. :func:`~.tokenization.encode_pairs` tokenises the whole pair every time, which took
about a twentieth of the loop's time on HotpotQA (the Rust tokenizer plus the Python that aligns its words). Here a
chunk's word list is tokenised once (per tokenizer, shared by the models that have the same one) and each pair is
spliced from the query's and the chunk's sub-tokens: with ``is_split_into_words`` a WordPiece tokenizer splits
every word on its own, so the splice is the tokenizer's own output. :class:`PairEncoder` checks the tokenizer's pair
template on construction and falls back to :func:`~.tokenization.encode_pairs` where it is not
``[CLS] A [SEP] B [SEP]`` or where a probe does not come out identical; ``tests/efficientrag/test_pair_encoding.py``
holds the two equal on real chunks, truncation and odd words.

The loop's :meth:`~effrag.pipelines.efficientrag.loop.EfficientRAGLoop.prepare` fills the cache with a corpus's chunks
ahead of the questions (:meth:`PairEncoder.chunk_tokens`): the reads then cost only the model.
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from .tokenization import Encoded, encode_pairs, tokenizer_spec

# probe words for the template check: accents, CJK, punctuation inside a word, an over-long word, control chars
_PROBE_QUERY = ["Who", "wrote", "Café", "au", "lait's", "lyrics", "?"]
_PROBE_CHUNK = ["東京", "(", "U.S.", ")", "x" * 120, "naïve", "\x00\x07", "re-entry", "e.g.", "100,000", "."]


class PairEncoder:
    """:func:`~.tokenization.encode_pairs` for inference (no labels), with each chunk's sub-tokens cached.

    ``capacity`` bounds the cache (least recently used chunks go first); a cached chunk costs about 6 bytes per
    sub-token (ids as 32-bit ints, each word's first sub-token as a 16-bit offset). Thread-safe: ``effrag serve``
    runs batches from several threads.
    """

    def __init__(self, tokenizer, capacity: int = 250_000):
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._chunks: OrderedDict[tuple[str, ...], tuple[array, array]] = OrderedDict()
        self._lock = threading.Lock()
        self.fast = self._template_ok()

    # ------------------------------------------------------------------ the template
    def _template_ok(self) -> bool:
        """Whether pairs of this tokenizer are ``[CLS] A [SEP] B [SEP]`` (token types 0 then 1) and a probe spliced
        here equals the tokenizer's own encoding, truncated and not."""
        tok = self.tokenizer
        if not getattr(tok, "is_fast", False) or tok.num_special_tokens_to_add(pair=True) != 3:
            return False
        self.cls, self.sep = tok.cls_token_id, tok.sep_token_id
        if self.cls is None or self.sep is None:
            return False
        self.fast = True
        try:
            for max_length in (512, 24, 14):
                want = encode_pairs(tok, [_PROBE_QUERY, []], [_PROBE_CHUNK, _PROBE_CHUNK[:3]], max_length=max_length)
                got = self._encode([_PROBE_QUERY, []], [_PROBE_CHUNK, _PROBE_CHUNK[:3]], max_length, 0.5,
                                   cache=False)
                if [vars(e) for e in want] != [vars(e) for e in got]:
                    return False
        except Exception:  # noqa: BLE001 - any surprise in the tokenizer: use its own pair encoding
            return False
        return True

    # ------------------------------------------------------------------ chunks
    def _tokenize(self, chunks: list[list[str]]) -> list[tuple[array, array]]:
        """Each chunk's sub-token ids and the offset of each word's first sub-token (-1: the word has none)."""
        safe = [c if c else ["."] for c in chunks]
        # whole chunks, longer than a model reads: verbose=False spares the tokenizer's over-length warning
        enc = self.tokenizer(safe, is_split_into_words=True, add_special_tokens=False, verbose=False)
        out = []
        for i, c in enumerate(chunks):
            starts = array("h", [-1]) * len(c)
            prev = None
            for t, w in enumerate(enc.word_ids(i)):
                if w is not None and w != prev and c:
                    starts[w] = t if t < 32767 else 32767  # past any max_length: never visible
                prev = w
            out.append((array("i", enc["input_ids"][i]), starts))
        return out

    def chunk_tokens(self, chunks: Sequence[Sequence[str]], cache: bool = True) -> list[tuple[array, array]]:
        """``(ids, first sub-token of each word)`` of each chunk word list, tokenised once while cached."""
        keys = [tuple(c) for c in chunks]  # a tuple is its own key (the loop's words are tuples): held once
        if not cache:
            return self._tokenize([list(k) for k in keys])
        with self._lock:
            found = {k: self._chunks[k] for k in set(keys) if k in self._chunks}
            for k in found:
                self._chunks.move_to_end(k)
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            made = dict(zip(missing, self._tokenize([list(k) for k in missing])))
            found.update(made)
            with self._lock:
                self._chunks.update(made)
                while len(self._chunks) > self.capacity:
                    self._chunks.popitem(last=False)
        return [found[k] for k in keys]

    def __len__(self) -> int:
        return len(self._chunks)

    # ------------------------------------------------------------------ pairs
    def encode(self, queries: list[list[str]], chunks: Sequence[Sequence[str]], max_length: int,
               max_query_fraction: float = 0.5) -> list[Encoded]:
        """What ``encode_pairs(tokenizer, queries, chunks, None, max_length, max_query_fraction)`` returns."""
        if not self.fast:
            return encode_pairs(self.tokenizer, queries, [list(c) for c in chunks], None, max_length,
                                max_query_fraction)
        return self._encode(queries, chunks, max_length, max_query_fraction)

    def _queries(self, queries: list[list[str]], budget: int) -> list[list[int]]:
        """Each query's sub-tokens, cut after the last whole word that fits ``budget`` (as ``fit_queries``); an
        empty query reads as ``?``."""
        distinct = list(dict.fromkeys(tuple(q) for q in queries))  # a query is read beside many chunks: once
        enc = self.tokenizer([list(q) if q else ["?"] for q in distinct], is_split_into_words=True,
                             add_special_tokens=False)
        fitted = {}
        for i, q in enumerate(distinct):
            ids, wids = enc["input_ids"][i], enc.word_ids(i)
            if q and len(ids) > budget:
                first = wids[budget]  # the first word that does not fit entirely; every earlier word does
                cut = next(t for t, w in enumerate(wids) if w == first)
                ids = ids[:cut] if cut else self.tokenizer(["?"], is_split_into_words=True,
                                                           add_special_tokens=False)["input_ids"]
            fitted[q] = list(ids)
        return [fitted[tuple(q)] for q in queries]

    def _encode(self, queries, chunks, max_length: int, max_query_fraction: float, cache: bool = True):
        if len(queries) != len(chunks):
            raise ValueError(f"{len(queries)} queries for {len(chunks)} chunks")
        budget = max(1, int((max_length - 3) * max_query_fraction))
        q_ids = self._queries(queries, budget)
        out = []
        for q, c, (ids, starts) in zip(q_ids, chunks, self.chunk_tokens(chunks, cache=cache)):
            room = max(0, max_length - 3 - len(q))
            seen = ids[:room]
            head = len(q) + 2
            input_ids = [self.cls, *q, self.sep, *seen, self.sep]
            pos = [head + s if 0 <= s < room else -1 for s in starts]
            visible = [w for w, p in enumerate(pos) if p >= 0]
            out.append(Encoded(input_ids=input_ids, attention_mask=[1] * len(input_ids),
                               token_type_ids=[0] * head + [1] * (len(seen) + 1), labels=[-100] * len(input_ids),
                               word_positions=pos,
                               truncated=len(c) - (visible[-1] + 1 if visible else 0) if c else 0))
        return out


_ENCODERS: dict[str, PairEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def pair_encoder(tokenizer) -> PairEncoder:
    """The :class:`PairEncoder` of ``tokenizer``, shared by every model whose tokenizer is the same (the Labeler and
    a ranker trained from the same encoder share their chunks' sub-tokens)."""
    key = getattr(tokenizer, "_effrag_pair_key", None)
    if key is None:
        key = hashlib.sha256(tokenizer_spec(tokenizer).encode()).hexdigest()
        try:
            tokenizer._effrag_pair_key = key
        except AttributeError:
            pass
    with _ENCODERS_LOCK:
        if key not in _ENCODERS:
            _ENCODERS[key] = PairEncoder(tokenizer)
        return _ENCODERS[key]
