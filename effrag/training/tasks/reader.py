"""The ``reader`` training task: the extractive reader (span + yes/no + no-answer) on SQuAD-style examples.

A record (one JSONL line) is ``{"question", "context", "answer", "answer_start", "dataset"}`` and an
optional ``"answer_type"`` (``"span"``, ``"yes"``, ``"no"``). ``answer_start`` null means the context
does not answer the question (both span heads then point at [CLS] and the confidence target is 0),
unless ``answer_type`` is yes/no: the context answers and the type head learns which. The span loss
credits the record's own answer occurrence, or with reader option ``span_targets="all"`` every
occurrence of the answer text in the context (:func:`answer_occurrences`).
:func:`write_reader_data` builds these files from dataset files (:func:`build_reader_examples`):

* MuSiQue sub-questions (``#k`` references resolved with earlier answers) with their answer in
  their own paragraph; 2Wiki evidence triples as "What is the <relation> of <subject>?";
* the full question with its answer found verbatim in a gold paragraph;
* the full question over all its gold paragraphs read together (plus a distractor), with its span
  or its yes/no answer: how the reader answers a retrieval method's pool;
* no-answer examples: gold paragraphs without the answer, ``negatives_per_question`` distractor
  paragraphs per question, and distractors read together.

Records are written once rather than made from the dataset files at training time because the
loop reads one record per training example: its subsets (``max_train_examples``), caps and
per-dataset metrics then count reader examples, as they count Labeler records.
"""
from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ...models.reader import (ANSWER_TYPES, CONFIDENCE_THRESHOLD, IGNORE, PASSAGE_SEPARATOR, ExtractiveReader,
                              YES_NO, passage_text, span_loss)
from ...models.spans import best_spans
from ..data import RecordError
from .base import Task, ratio, register_task

RECORDS_NAME = "reader.jsonl"
JOINT_DISTRACTORS = (1, 0, 3)  # distractors in each joint record of a question (see build_reader_examples)
_YESNO = {"yes", "no", "noanswer", ""}
_REF = re.compile(r"#(\d+)")


# -- records from dataset files -------------------------------------------------------------------
def _find(answer: str, text: str) -> int | None:
    a = answer.strip().strip('"').strip()
    if a.lower() in _YESNO or len(a) < 1:
        return None
    idx = text.lower().find(a.lower())
    return idx if idx >= 0 else None


def _hop_question(template: str, answers: list[str]) -> str:
    """MuSiQue sub-question with ``#k`` replaced; ``"#1 >> spouse"`` becomes ``"What is the spouse of X?"``."""
    def resolve(m: re.Match) -> str:
        k = int(m.group(1))
        return answers[k - 1] if 0 < k <= len(answers) else m.group(0)

    q = _REF.sub(resolve, template)
    if ">>" in q:
        subj, rel = (s.strip() for s in q.split(">>", 1))
        q = f"What is the {rel} of {subj}?"
    return q


def _record(question: str, context: str, dataset: str, answer: str = "", start: int | None = None,
            answer_type: str | None = None) -> dict:
    rec = {"question": question, "context": context, "answer": answer, "answer_start": start, "dataset": dataset}
    if answer_type is not None:
        rec["answer_type"] = answer_type
    return rec


def _span_or_none(question: str, context: str, dataset: str, answers: Sequence[str]) -> dict | None:
    """A span record for the first of ``answers`` found in ``context``, else None."""
    for a in answers:
        idx = _find(a, context)
        if idx is not None:
            a = a.strip().strip('"').strip()
            return _record(question, context, dataset, context[idx:idx + len(a)], idx)
    return None


def build_reader_examples(questions: Iterable, negatives_per_question: int = 1, seed: int = 0,
                          joint_distractors: Sequence[int] | int = JOINT_DISTRACTORS) -> list[dict]:
    """Reader records from :class:`~effrag.data.records.Question` records (see the module doc).

    Passages read as at answer time (``"title: text"``, :func:`~effrag.models.reader.passage_text`).
    Besides one-passage records, each question gives *joint* records, one per entry of
    ``joint_distractors``: its gold passages and that many distractors shuffled into one context, with
    the full question's span, or its yes/no answer type; and a joint no-answer record of distractors
    alone. Joint records are how the reader reads at answer time, so several shuffles of them are the
    cheapest extra data the few train questions give.
    """
    if isinstance(joint_distractors, int):
        joint_distractors = (joint_distractors,)
    rng = random.Random(seed)
    out: list[dict] = []
    for q in questions:
        gold_ids = {p.id for p in q.gold}
        distractors = [p for p in q.contexts if p.id not in gold_ids]
        pairs: list[tuple[str, str, object]] = []  # (question, answer, passage)
        if q.decomposition:
            answers = [s.answer for s in q.decomposition]
            for s in q.decomposition:
                if s.passage is not None and 0 <= s.passage < len(q.gold):
                    pairs.append((_hop_question(s.question, answers), s.answer, q.gold[s.passage]))
        by_title = {p.title.strip().lower(): p for p in q.gold}
        for subj, rel, obj in q.evidences or []:  # 2Wiki (subject, relation, object) triples
            passage = by_title.get(str(subj).strip().lower())
            if passage is not None:
                pairs.append((f"What is the {str(rel).replace('_', ' ')} of {subj}?", str(obj), passage))
        for p in q.gold:
            pairs.append((q.question, q.answer, p))
        seen = set()
        for question, answer, passage in pairs:
            key = (question, passage.id)
            if key in seen:
                continue
            seen.add(key)
            context = passage_text(passage.title, passage.text)
            alts = [answer] + ([x for x in q.answers if x != answer] if question == q.question else [])
            rec = _span_or_none(question, context, q.dataset, alts)
            if rec is not None:
                out.append(rec)
            elif answer.strip().lower() not in _YESNO and question == q.question:
                out.append(_record(question, context, q.dataset))
        for p in rng.sample(distractors, min(negatives_per_question, len(distractors))):
            question = rng.choice([x[0] for x in pairs]) if pairs else q.question
            out.append(_record(question, passage_text(p.title, p.text), q.dataset))
        for i, n_extra in enumerate(joint_distractors):  # the full question over its gold passages read together
            if not q.gold:
                break
            extra = rng.sample(distractors, min(n_extra, len(distractors)))
            passages = list(q.gold) + extra
            rng.shuffle(passages)
            context = PASSAGE_SEPARATOR.join(passage_text(p.title, p.text) for p in passages)
            kind = q.answer.strip().lower()
            if kind in YES_NO:
                out.append(_record(q.question, context, q.dataset, kind, None, kind))
            else:
                rec = _span_or_none(q.question, context, q.dataset, q.answers)
                if rec is not None:
                    out.append(rec)
            others = [p for p in distractors if p not in extra]
            if others and i == 0:  # one no-answer record of distractors alone
                alone = rng.sample(others, min(len(q.gold) + n_extra, len(others)))
                out.append(_record(q.question, PASSAGE_SEPARATOR.join(passage_text(p.title, p.text) for p in alone),
                                   q.dataset))
    return out


def write_reader_data(inputs: Sequence[str | Path], out_dir: str | Path, *, limit: int | None = None,
                      negatives_per_question: int = 1, seed: int = 0,
                      joint_distractors: Sequence[int] | int = JOINT_DISTRACTORS) -> dict:
    """Write the reader records of dataset files (any ``load_questions`` format) to ``out_dir/reader.jsonl``.

    ``limit`` takes the first questions of each file. The file appears whole or not at all
    (written beside and renamed), so a caller may treat its presence as "done".
    """
    from ...data import load_questions

    questions = [q for f in inputs for q in load_questions(f, limit=limit)]
    records = build_reader_examples(questions, negatives_per_question, seed, joint_distractors)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (RECORDS_NAME + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, out / RECORDS_NAME)
    return {"inputs": [str(f) for f in inputs], "questions": len(questions), "records": len(records),
            "answerable": sum(r["answer_start"] is not None or r.get("answer_type") in YES_NO for r in records)}


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
