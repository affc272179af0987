"""The ``reader`` training task: the extractive reader (span + yes/no + no-answer) on SQuAD-style examples.

A record (one JSONL line) is ``{"question", "context", "answer", "answer_start", "dataset"}`` and an
optional ``"answer_type"`` (``"span"``, ``"yes"``, ``"no"``). ``answer_start`` null means the context
does not answer the question (both span heads then point at [CLS] and the confidence target is 0),
unless ``answer_type`` is yes/no: the context answers and the type head learns which. The span loss
credits the record's own answer occurrence, or with reader option ``span_targets="all"`` every
occurrence of the answer text in the context (:func:`answer_occurrences`).

The records are training data, built from dataset files like the Labeler's: by
:mod:`data_synthesis.reader_records` (``write_reader_data``).
"""
from __future__ import annotations

import re

import torch

from ...models.reader import ANSWER_TYPES, CONFIDENCE_THRESHOLD, IGNORE, YES_NO, ExtractiveReader, span_loss
from ...models.spans import best_spans
from ..data import RecordError
from .base import Task, ratio, register_task


# -- the task --------------------------------------------------------------------------------------
def check_reader_record(rec: dict, loc: str) -> None:
    for key in ("question", "context"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise RecordError(f"{loc}: field {key!r} must be a non-empty string")
    start, answer, kind = rec.get("answer_start"), rec.get("answer", ""), rec.get("answer_type")
    if kind is not None and kind not in ANSWER_TYPES:
        raise RecordError(f"{loc}: field 'answer_type' must be one of {list(ANSWER_TYPES)}, got {kind!r}")
    if kind in YES_NO:
        if start is not None:
            raise RecordError(f"{loc}: a {kind!r} answer has no span: field 'answer_start' must be null")
        return
    if start is None:
        if kind == "span":
            raise RecordError(f"{loc}: field 'answer_type' is 'span' but 'answer_start' is null")
        return
    if not isinstance(start, int) or isinstance(start, bool) or not isinstance(answer, str) or not answer:
        raise RecordError(f"{loc}: field 'answer_start' must be null or an integer with a non-empty 'answer'")
    if rec["context"][start:start + len(answer)] != answer:
        raise RecordError(f"{loc}: field 'answer' {answer!r} is not at context[{start}:]")


def answer_tokens(sequence_ids: list, offsets: list, start: int | None, answer: str) -> tuple[int, int]:
    """Token positions of the answer's first and last characters in the context; ``(0, 0)`` ([CLS])
    when there is no answer or truncation cut it away."""
    if start is None:
        return 0, 0
    c0, c1 = start, start + len(answer)
    s_tok = e_tok = 0
    for j, sid in enumerate(sequence_ids):
        if sid != 1:
            continue
        o0, o1 = offsets[j]
        if s_tok == 0 and o0 <= c0 < max(o1, o0 + 1):
            s_tok = j
        if o0 < c1 <= o1:
            e_tok = j
            break
    return (0, 0) if s_tok == 0 or e_tok < s_tok else (s_tok, e_tok)


def answer_occurrences(context: str, answer: str, start: int) -> list[int]:
    """Character starts of every occurrence of ``answer`` in ``context`` (case-insensitive, not inside
    a longer word), ``start`` (the record's own) first."""
    found = [start]
    if not answer:
        return found
    pattern = re.compile((r"(?<!\w)" if answer[0].isalnum() else "") + re.escape(answer)
                         + (r"(?!\w)" if answer[-1].isalnum() else ""), re.IGNORECASE)
    return found + [m.start() for m in pattern.finditer(context) if m.start() != start]


def featurize_reader(model: ExtractiveReader, records: list[dict], max_length: int) -> list[dict]:
    """Token features of reader records. ``start_positions``/``end_positions``: the record's own answer
    (what the span metrics check); ``start_targets``/``end_targets``: every token a span loss may
    credit, i.e. each occurrence of the answer that survives truncation (model option
    ``span_targets="all"``) or the record's own only (``"first"``), and [CLS] when none does."""
    every = model.options.get("span_targets") == "all"
    enc = model.encode([r["question"] for r in records], [r["context"] for r in records], max_length)
    feats = []
    for b, r in enumerate(records):
        kind = r.get("answer_type")
        n_tok = len(enc["input_ids"][b])
        s_mark, e_mark = [0] * n_tok, [0] * n_tok
        if kind in YES_NO:  # answers, but not with a span: the span heads skip it
            s = e = IGNORE
            answerable, type_id = 1, ANSWER_TYPES.index(kind)
        else:
            seq, offsets, answer, start = enc.sequence_ids(b), enc["offset_mapping"][b], r.get("answer", ""), \
                r.get("answer_start")
            starts = [start] if start is None or not every else answer_occurrences(r["context"], answer, start)
            spans = [t for t in (answer_tokens(seq, offsets, c, answer) for c in starts) if t[0] > 0]
            s, e = spans[0] if spans else (0, 0)
            for s_tok, e_tok in spans or [(0, 0)]:
                s_mark[s_tok] = e_mark[e_tok] = 1
            answerable = int(s > 0)
            type_id = 0 if answerable else IGNORE
        f = {"input_ids": enc["input_ids"][b], "attention_mask": enc["attention_mask"][b],
             "start_positions": s, "end_positions": e, "start_targets": s_mark, "end_targets": e_mark,
             "answerable": answerable, "answer_type": type_id}
        if "token_type_ids" in enc:
            f["token_type_ids"] = enc["token_type_ids"][b]
        feats.append(f)
    return feats


STAT_NAMES = ["span_correct", "spans", "answer_correct", "answerable", "confidence_correct", "span_loss_sum",
              "confidence_loss_sum", "n"]


def reader_stats(out, batch) -> torch.Tensor:
    """Per example: exact best span (span examples), the right answer (span examples: exact span and
    type "span"; yes/no examples: the type), ``f > theta`` agreeing with answerability, and the losses
    (span loss over span and no-answer examples)."""
    allowed = batch["attention_mask"].bool().clone()
    allowed[:, 0] = False  # as at inference: the best real span, [CLS] excluded
    b_s, b_e, _ = best_spans(out.start_logits, out.end_logits, allowed)
    answerable = batch["answerable"].bool()
    kind = batch["answer_type"]
    is_span = kind == 0
    own_length = batch["end_positions"] - batch["start_positions"]
    marked = (batch["start_targets"].gather(1, b_s[:, None])[:, 0].bool()
              & batch["end_targets"].gather(1, b_e[:, None])[:, 0].bool())
    span_ok = marked & (b_e - b_s == own_length) & is_span  # the answer's text at any of its occurrences
    pred_kind = out.type_logits.argmax(-1)
    answer_ok = torch.where(is_span, span_ok & (pred_kind == 0), (pred_kind == kind) & answerable)
    loss = span_loss(out.start_logits, out.end_logits, batch["start_targets"], batch["end_targets"], reduction="none")
    conf_loss = torch.nn.functional.binary_cross_entropy_with_logits(out.confidence.float(), answerable.float(),
                                                                     reduction="none")
    cols = [span_ok, is_span, answer_ok, answerable, (out.confidence > CONFIDENCE_THRESHOLD) == answerable,
            loss, conf_loss, torch.ones_like(loss)]
    return torch.stack([c.float() for c in cols], 1)


def reader_metrics(s: dict) -> dict:
    return {"span_exact": ratio(s["span_correct"], s["spans"]),
            "answer_exact": ratio(s["answer_correct"], s["answerable"]),  # spans and yes/no together
            "answerable_accuracy": ratio(s["confidence_correct"], s["n"]),  # at SearChain's theta
            "span_loss": ratio(s["span_loss_sum"], s["n"]), "confidence_loss": ratio(s["confidence_loss_sum"], s["n"]),
            "answerable": s["answerable"], "n": s["n"]}


register_task(Task(
    name="reader",
    model_cls=ExtractiveReader,
    check_record=check_reader_record,
    featurize=featurize_reader,
    stat_names=STAT_NAMES,
    batch_stats=reader_stats,
    summarize=reader_metrics,
    default_metric="answer_exact",
    pad_values={"start_targets": 0, "end_targets": 0},
))
