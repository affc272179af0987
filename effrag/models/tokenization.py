"""Word -> sub-token alignment for the word-labelled training files.

Synthesis labels *words* (``effrag.text.words``), models see sub-tokens. A word's
label goes on its **first** sub-token only; continuation sub-tokens, query tokens,
special tokens and padding get ``IGNORE`` (-100) so the loss and the metrics count
each visible word exactly once and never count padding as a negative. At inference
the same first-sub-token positions give one probability per word
(:func:`first_subtoken_positions`).

Two layouts:

* pair (Labeler): ``[CLS] query words [SEP] chunk words [SEP]``; only the chunk
  (second sequence) is labelled and only the chunk is truncated.
* single (Filter): ``[CLS] words [SEP]``; every word is labelled.

Both need a *fast* tokenizer (``word_ids`` comes from the Rust tokenizers).
"""
from __future__ import annotations

from dataclasses import dataclass

IGNORE = -100


@dataclass
class Encoded:
    """One encoded example: model inputs plus aligned labels and word bookkeeping."""

    input_ids: list[int]
    attention_mask: list[int]
    token_type_ids: list[int] | None
    labels: list[int]  # IGNORE except at the first sub-token of each labelled word
    word_positions: list[int]  # per labelled word: index of its first sub-token, -1 if not visible
    truncated: int  # labelled words cut away by max_length at the end

    def features(self) -> dict:
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}
        if self.token_type_ids is not None:
            out["token_type_ids"] = self.token_type_ids
        return out


def tokenizer_spec(tokenizer) -> str:
    """What a tokenizer splits text by, as one string to hash: a fast tokenizer's saved form less its truncation and
    padding (every encoding call sets those, so hashing them gave one tokenizer other digests depending on what it had
    read before), else its vocabulary."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
        return json.dumps(spec, sort_keys=True)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else tokenizer
    return repr(sorted(vocab.items()) if isinstance(vocab, dict) else vocab)


def check_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; word alignment needs word_ids() "
            "(load the tokenizer with AutoTokenizer.from_pretrained(..., use_fast=True))"
        )


def fit_queries(tokenizer, queries: list[list[str]], budget: int) -> list[list[str]]:
    """For each query, the longest prefix of its words whose sub-tokens fit in ``budget``.

    The chunk is what gets labelled, so an over-long query is cut here rather than
    letting truncation eat the chunk (or fail, as ``only_second`` does).
    """
    nonempty = [i for i, q in enumerate(queries) if q]
    out = list(queries)
    if not nonempty:
        return out
    enc = tokenizer([queries[i] for i in nonempty], is_split_into_words=True, add_special_tokens=False)
    for j, i in enumerate(nonempty):
        wids = enc.word_ids(j)
        if len(wids) > budget:
            # word of the first sub-token past the budget: every earlier word fits entirely
            out[i] = queries[i][: wids[budget]]
    return out


def _first_positions(word_ids: list[int | None], seq_ids: list[int | None], seq: int, n_words: int) -> list[int]:
    pos = [-1] * n_words
    prev = None
    for i, (w, s) in enumerate(zip(word_ids, seq_ids)):
        if w is None or s != seq or w >= n_words:  # w >= n_words: the placeholder word of an empty list
            prev = None
            continue
        if w != prev and pos[w] == -1:
            pos[w] = i
        prev = w
    return pos


def first_subtoken_positions(encoding, batch_index: int, seq: int, n_words: int) -> list[int]:
    """Index of the first sub-token of each word of sequence ``seq`` in a batch encoding (-1 if absent)."""
    return _first_positions(encoding.word_ids(batch_index), encoding.sequence_ids(batch_index), seq, n_words)


def _finish(encoding, i: int, seq: int, words: list[str], labels: list[int] | None) -> Encoded:
    pos = first_subtoken_positions(encoding, i, seq, len(words))
    ids = encoding["input_ids"][i]
    tok_labels = [IGNORE] * len(ids)
    if labels is not None:
        for w, p in enumerate(pos):
            if p >= 0:
                tok_labels[p] = int(labels[w])
    visible = [w for w, p in enumerate(pos) if p >= 0]
    truncated = len(words) - (visible[-1] + 1 if visible else 0) if words else 0
    tti = encoding.get("token_type_ids")
    return Encoded(
        input_ids=list(ids),
        attention_mask=list(encoding["attention_mask"][i]),
        token_type_ids=list(tti[i]) if tti is not None else None,
        labels=tok_labels,
        word_positions=pos,
        truncated=truncated,
    )


def encode_pairs(
    tokenizer,
    queries: list[list[str]],
    chunks: list[list[str]],
    labels: list[list[int]] | None = None,
    max_length: int = 384,
    max_query_fraction: float = 0.5,
) -> list[Encoded]:
    """Encode (query words, chunk words) pairs; labels (per chunk word) go on chunk first sub-tokens."""
    check_fast(tokenizer)
    if labels is not None and len(labels) != len(chunks):
        raise ValueError(f"{len(labels)} label lists for {len(chunks)} chunks")
    special = tokenizer.num_special_tokens_to_add(pair=True)
    budget = max(1, int((max_length - special) * max_query_fraction))
    queries = fit_queries(tokenizer, queries, budget)
    # an empty word list is not a valid "sequence" for the tokenizer: use a lone placeholder word
    safe_q = [q if q else ["?"] for q in queries]
    safe_c = [c if c else ["."] for c in chunks]
    enc = tokenizer(
        safe_q, safe_c, is_split_into_words=True, truncation="only_second", max_length=max_length
    )
    return [_finish(enc, i, 1, chunks[i], labels[i] if labels is not None else None) for i in range(len(chunks))]


def encode_singles(
    tokenizer, words: list[list[str]], labels: list[list[int]] | None = None, max_length: int = 256
) -> list[Encoded]:
    """Encode single word sequences; every word's first sub-token carries its label."""
    check_fast(tokenizer)
    if labels is not None and len(labels) != len(words):
        raise ValueError(f"{len(labels)} label lists for {len(words)} word lists")
    safe = [w if w else ["."] for w in words]
    enc = tokenizer(safe, is_split_into_words=True, truncation=True, max_length=max_length)
    return [_finish(enc, i, 0, words[i], labels[i] if labels is not None else None) for i in range(len(words))]


def pad_batch(features: list[dict], pad_token_id: int, pad_values: dict | None = None) -> dict:
    """Right-pad a list of feature dicts into tensors.

    ``input_ids`` pad with ``pad_token_id``, masks and token types with 0, ``labels``
    with ``IGNORE`` (padding is never a negative); other per-token fields need a pad value
    in ``pad_values``; scalar fields (``tag``) are stacked.
    """
    import torch

    if not features:
        raise ValueError("pad_batch got an empty batch")
    width = max(len(f["input_ids"]) for f in features)
    pad_values = {"input_ids": pad_token_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE,
                  **(pad_values or {})}
    out = {}
    for key in features[0]:
        vals = [f[key] for f in features]
        if key in pad_values:
            out[key] = torch.tensor([v + [pad_values[key]] * (width - len(v)) for v in vals], dtype=torch.long)
        elif isinstance(vals[0], (list, tuple)):
            raise ValueError(f"pad_batch does not know how to pad list field {key!r}: give it a pad value")
        else:
            out[key] = torch.tensor(vals)
    return out


def length_batches(lengths: list[int], batch_size: int, min_fill: float = 0.6) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first) to minimise padding at inference.

    A batch holds at most ``batch_size`` inputs, and an input shorter than ``min_fill`` of its batch's longest
    starts a new batch: a call of few inputs of mixed lengths (the loop reads a handful per question) would
    otherwise pad all of them to the longest, and on a CPU a padded token costs what a real one does (the
    Labeler's reads were 44% padding in one batch of 32). ``min_fill=0`` gives fixed-size batches.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < batch_size and lengths[i] >= min_fill * lengths[batches[-1][0]]:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
