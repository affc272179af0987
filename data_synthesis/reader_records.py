"""The extractive reader's training records, built from dataset files (``effrag.training.tasks.reader`` trains on them).

A record (one JSONL line) is ``{"question", "context", "answer", "answer_start", "dataset"}`` and an optional
``"answer_type"`` (``"span"``, ``"yes"``, ``"no"``); :func:`write_reader_data` builds these files from dataset
files (:func:`build_reader_examples`):

* MuSiQue sub-questions (``#k`` references resolved with earlier answers) with their answer in
  their own paragraph; 2Wiki evidence triples as "What is the <relation> of <subject>?";
* the full question with its answer found verbatim in a gold paragraph;
* the full question over all its gold paragraphs read together (plus a distractor), with its span
  or its yes/no answer: how the reader answers a retrieval method's pool;
* no-answer examples: gold paragraphs without the answer, ``negatives_per_question`` distractor
  paragraphs per question, and distractors read together.

Records are written once rather than made from the dataset files at training time because the
loop reads one record per training example: its subsets (``max_train_examples``), caps and
per-dataset metrics then count reader examples, as they count Labeler records. Passages read as at answer time
(:func:`effrag.text.reader_passage`, packed with :data:`effrag.text.PASSAGE_SEPARATOR`).
"""
from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from effrag.models.reader import YES_NO
from effrag.text import PASSAGE_SEPARATOR, reader_passage

RECORDS_NAME = "reader.jsonl"
JOINT_DISTRACTORS = (1, 0, 3)  # distractors in each joint record of a question (see build_reader_examples)
_YESNO = {"yes", "no", "noanswer", ""}
_REF = re.compile(r"#(\d+)")


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
            context = reader_passage(passage.title, passage.text)
            alts = [answer] + ([x for x in q.answers if x != answer] if question == q.question else [])
            rec = _span_or_none(question, context, q.dataset, alts)
            if rec is not None:
                out.append(rec)
            elif answer.strip().lower() not in _YESNO and question == q.question:
                out.append(_record(question, context, q.dataset))
        for p in rng.sample(distractors, min(negatives_per_question, len(distractors))):
            question = rng.choice([x[0] for x in pairs]) if pairs else q.question
            out.append(_record(question, reader_passage(p.title, p.text), q.dataset))
        for i, n_extra in enumerate(joint_distractors):  # the full question over its gold passages read together
            if not q.gold:
                break
            extra = rng.sample(distractors, min(n_extra, len(distractors)))
            passages = list(q.gold) + extra
            rng.shuffle(passages)
            context = PASSAGE_SEPARATOR.join(reader_passage(p.title, p.text) for p in passages)
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
                out.append(_record(q.question, PASSAGE_SEPARATOR.join(reader_passage(p.title, p.text) for p in alone),
                                   q.dataset))
    return out


def write_reader_data(inputs: Sequence[str | Path], out_dir: str | Path, *, limit: int | None = None,
                      negatives_per_question: int = 1, seed: int = 0,
                      joint_distractors: Sequence[int] | int = JOINT_DISTRACTORS) -> dict:
    """Write the reader records of dataset files (any ``load_questions`` format) to ``out_dir/reader.jsonl``.

    ``limit`` takes the first questions of each file. The file appears whole or not at all
    (written beside and renamed), so a caller may treat its presence as "done".
    """
    from effrag.data import load_questions

    questions = [q for f in inputs for q in load_questions(f, limit=limit)]
    records = build_reader_examples(questions, negatives_per_question, seed, joint_distractors)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from effrag.state_files import write_text_atomic

    write_text_atomic(out / RECORDS_NAME, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return {"inputs": [str(f) for f in inputs], "questions": len(questions), "records": len(records),
            "answerable": sum(r["answer_start"] is not None or r.get("answer_type") in YES_NO for r in records)}
