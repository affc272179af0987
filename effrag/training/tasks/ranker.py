"""The ``ranker`` training task: one group of candidates per record, a softmax over each group.

A record (``data_synthesis.ranker_groups``) is ``{"qid", "dataset", "hop", "query", "candidates":
[{"chunk_id", "title", "text", "gold"}, ...]}``: one gold chunk of the question with the hard negatives
of the same query. A feature is the whole group, so the listwise loss always sees every candidate of a
group in one batch; :func:`.base.group_collator` flattens a batch of groups into pairs and tags each pair with
its group's index (``rank_group``), as IRRR's steps are.
"""
from __future__ import annotations

import math

import torch

from ...models.ranker import RankerModel
from ...text import chunk_text, words_batch
from .base import Task, group_collator, ratio, register_task

PAIR_KEYS = ("input_ids", "token_type_ids", "attention_mask", "rank_label", "rank_teacher")


def check_ranker_record(rec: dict, loc: str) -> None:
    for key, typ in (("query", str), ("candidates", list)):
        if not isinstance(rec.get(key), typ):
            raise ValueError(f"{loc}: field {key!r} must be a {typ.__name__}")
    if not rec["query"].strip():
        raise ValueError(f"{loc}: field 'query' is empty")
    if len(rec["candidates"]) < 2:
        raise ValueError(f"{loc}: field 'candidates' needs at least 2 entries (a gold chunk and a negative)")
    for i, c in enumerate(rec["candidates"]):
        if not isinstance(c, dict):
            raise ValueError(f"{loc}: candidates[{i}] must be an object")
        for key in ("title", "text", "gold"):
            if key not in c:
                raise ValueError(f"{loc}: candidates[{i}] has no field {key!r}")
        if c["gold"] not in (0, 1, True, False):
            raise ValueError(f"{loc}: candidates[{i}].gold must be 0 or 1, got {c['gold']!r}")
        teacher = c.get("teacher")
        if teacher is not None and (isinstance(teacher, bool) or not isinstance(teacher, (int, float))
                                    or not math.isfinite(teacher)):
            raise ValueError(f"{loc}: candidates[{i}].teacher must be a finite number, got {teacher!r}")
    if not any(c["gold"] for c in rec["candidates"]):
        raise ValueError(f"{loc}: no candidate has gold 1")


def featurize_ranker(model: RankerModel, records: list[dict], max_length: int) -> list[dict]:
    """One feature per group; with ``distill_weight`` > 0 a train record must carry the teacher's score of every
    candidate (``effrag ranker-teacher``); a candidate without one gets NaN, which the loss skips (dev groups)."""
    texts = [chunk_text(c["title"], c["text"]) for r in records for c in r["candidates"]]
    chunk_words = iter(words_batch(texts))
    query_words = words_batch([r["query"] for r in records])
    feats = []
    for r, qw in zip(records, query_words):
        cands = r["candidates"]
        enc = model.encode([qw] * len(cands), [next(chunk_words) for _ in cands], max_length=max_length)
        seqs = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask,
                 "rank_label": int(c["gold"]), "rank_teacher": float(c.get("teacher", math.nan))}
                for e, c in zip(enc, cands)]
        feats.append({"seqs": seqs, "length": sum(len(s["input_ids"]) for s in seqs)})
    return feats


STAT_NAMES = ["top1", "reciprocal_rank", "gold_in_top3", "loss_sum", "n"]


def ranker_stats(out, batch) -> torch.Tensor:
    """Per group: is a gold candidate ranked first, 1/rank of the best gold, a gold in the top 3, the loss."""
    item, label = batch["rank_group"], batch["rank_label"]
    n_items = int(item.max()) + 1
    rows = torch.zeros(n_items, len(STAT_NAMES), device=item.device)
    scores = out.scores.float()
    for i in range(n_items):
        m = item == i
        s, y = scores[m], label[m]
        if not (y == 1).any():
            continue
        best_gold = s[y == 1].max()
        rank = 1 + int((s[y != 1] > best_gold).sum())
        loss = -torch.logsumexp(s.log_softmax(0)[y == 1], 0)
        rows[i] = torch.tensor([float(rank == 1), 1.0 / rank, float(rank <= 3), float(loss), 1.0])
    return rows


def ranker_metrics(s: dict) -> dict:
    return {"top1": ratio(s["top1"], s["n"]), "mrr": ratio(s["reciprocal_rank"], s["n"]),
            "gold_in_top3": ratio(s["gold_in_top3"], s["n"]), "rank_loss": ratio(s["loss_sum"], s["n"]), "n": s["n"]}


register_task(Task(
    name="ranker",
    model_cls=RankerModel,
    check_record=check_ranker_record,
    featurize=featurize_ranker,
    stat_names=STAT_NAMES,
    batch_stats=ranker_stats,
    summarize=ranker_metrics,
    default_metric="mrr",
    collate=group_collator(PAIR_KEYS),
))
