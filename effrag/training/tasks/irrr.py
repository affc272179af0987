"""The ``irrr`` training task: step records -> one query sequence + one sequence per candidate.

A feature is a whole step (so the reranker's softmax sees all candidates of a path
in one batch); :func:`.base.group_collator` flattens a batch of steps into sequences and
tags each with its step's index in the batch (``rank_group``). The query sequence of
a step has ``rank_label`` IGNORE, so it is left out of the reranker's softmax.
"""
from __future__ import annotations

import torch

from ...models.irrr import ANSWER_TYPES, NOANSWER, IRRRModel
from ...models.irrr_encoding import find_answer
from ...models.spans import best_spans
from ...models.tokenization import IGNORE
from .base import TOKEN_STATS, Task, group_collator, ratio, register_task, token_metrics, token_stats

SEQ_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "answer_type", "start_positions",
            "end_positions", "rank_label")


def check_irrr_record(rec: dict, loc: str) -> None:
    for key, typ in (("question", str), ("answers", list), ("path", list), ("candidates", list),
                     ("query_labels", list)):
        if not isinstance(rec.get(key), typ):
            raise ValueError(f"{loc}: field {key!r} must be a {typ.__name__}")
    if len(rec["query_labels"]) != 1 + 2 * len(rec["path"]):
        raise ValueError(f"{loc}: field 'query_labels' has {len(rec['query_labels'])} segments, expected "
                         f"{1 + 2 * len(rec['path'])} (question + title and text of each path paragraph)")
    for i, c in enumerate(rec["candidates"]):
        for key in ("title", "text", "gold", "answer_type"):
            if key not in c:
                raise ValueError(f"{loc}: candidates[{i}] has no field {key!r}")
        if c["answer_type"] not in ANSWER_TYPES:
            raise ValueError(f"{loc}: candidates[{i}].answer_type is {c['answer_type']!r}; one of {ANSWER_TYPES}")


def _seq(enc, labels=None, answer_type=IGNORE, start=IGNORE, end=IGNORE, rank_label=IGNORE) -> dict:
    return {"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "attention_mask": enc.attention_mask,
            "labels": enc.token_labels(labels), "answer_type": answer_type, "start_positions": start,
            "end_positions": end, "rank_label": rank_label}


def featurize_irrr(model: IRRRModel, records: list[dict], max_length: int) -> list[dict]:
    feats = []
    for r in records:
        seqs = [_seq(model.encode(r["question"], r["path"], max_length), labels=r["query_labels"])]
        for c in r["candidates"]:
            enc = model.encode(r["question"], r["path"] + [c], max_length)
            at = ANSWER_TYPES.index(c["answer_type"])
            start = end = IGNORE
            if at == NOANSWER:
                start = end = 0  # unanswerable paths point the span heads at [CLS] (Appendix C)
            elif c["answer_type"] == "span":
                n = len(enc.segments)
                hit = find_answer(enc.segments, r["answers"][0], prefer=[n - 1, n - 2])
                if hit is not None:
                    si, a, b = hit
                    if enc.first[si][a] >= 0 and enc.last[si][b] >= 0:
                        start, end = enc.first[si][a], enc.last[si][b]
            seqs.append(_seq(enc, answer_type=at, start=start, end=end, rank_label=int(c["gold"])))
        feats.append({"seqs": seqs, "length": sum(len(x["input_ids"]) for x in seqs)})
    return feats


STAT_NAMES = TOKEN_STATS + ["type_correct", "n_cands", "answerable", "answerable_correct", "rank_top1",
                            "rank_groups", "span_correct", "n_spans", "n"]


def irrr_stats(out, batch) -> torch.Tensor:
    """Per step: query-token counts, reader type accuracy (all / answerable candidates), reranker top-1
    over steps with a gold candidate, span exact start+end on candidates with a span target."""
    item = batch["rank_group"]
    n_items = int(item.max()) + 1
    rows = torch.zeros(n_items, len(STAT_NAMES), device=item.device)
    tok = token_stats(out.token_logits, batch["labels"])
    rows[:, : len(TOKEN_STATS)].index_add_(0, item, tok.to(rows.dtype))
    at = batch["answer_type"]
    cand = at != IGNORE
    correct = (out.type_logits.float().argmax(-1) == at) & cand
    ans = cand & (at != NOANSWER)
    base = len(TOKEN_STATS)
    rows[:, base].index_add_(0, item, correct.float())
    rows[:, base + 1].index_add_(0, item, cand.float())
    rows[:, base + 2].index_add_(0, item, ans.float())
    rows[:, base + 3].index_add_(0, item, (correct & ans).float())
    scores = out.rank_scores.float()
    for i in range(n_items):
        m = (item == i) & (batch["rank_label"] != IGNORE)
        if m.any() and (batch["rank_label"][m] == 1).any():
            rows[i, base + 5] = 1
            rows[i, base + 4] = float(batch["rank_label"][m][scores[m].argmax()] == 1)
    sp = cand & (at != NOANSWER) & (batch["start_positions"] != IGNORE)
    allowed = batch["attention_mask"].bool().clone()
    allowed[:, 0] = False  # as at inference: the best real span, [CLS] excluded
    b_s, b_e, _ = best_spans(out.start_logits.float(), out.end_logits.float(), allowed)
    s_ok = (b_s == batch["start_positions"]) & (b_e == batch["end_positions"])
    rows[:, base + 6].index_add_(0, item, (s_ok & sp).float())
    rows[:, base + 7].index_add_(0, item, sp.float())
    rows[:, base + 8] = 1
    return rows


def irrr_metrics(s: dict) -> dict:
    m = token_metrics(s)
    out = {f"query_{k}": v for k, v in m.items()}
    out.update({
        "type_accuracy": ratio(s["type_correct"], s["n_cands"]),
        "answerable_recall": ratio(s["answerable_correct"], s["answerable"]),
        "rerank_top1": ratio(s["rank_top1"], s["rank_groups"]),
        "span_exact": ratio(s["span_correct"], s["n_spans"]),
        "n": s["n"],
    })
    out["score"] = (out["query_token_f1"] + out["rerank_top1"] + out["answerable_recall"] + out["span_exact"]) / 4
    return out


register_task(Task(
    name="irrr",
    model_cls=IRRRModel,
    check_record=check_irrr_record,
    featurize=featurize_irrr,
    stat_names=STAT_NAMES,
    batch_stats=irrr_stats,
    summarize=irrr_metrics,
    default_metric="score",
    collate=group_collator(SEQ_KEYS),
))
