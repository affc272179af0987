"""The ``late_ranker`` training task: the ranker's groups (:mod:`.ranker`), read by a late-interaction model.

A record is the ranker's (``{"query", "candidates": [{"title", "text", "gold", "teacher"?}, ...]}``, checked by the
same :func:`~.ranker.check_ranker_record`). A feature is the group: its query as one sequence (``rank_query`` 1), then
each candidate as its own sequence, so the query and the chunks are encoded apart, as at inference
(:class:`effrag.models.late_ranker.LateRankerModel`). The metrics are the ranker's (top1, mrr, gold in the top 3).
"""
from __future__ import annotations

import math

from ...models.late_ranker import LateRankerModel
from ...text import chunk_text, words_batch
from .base import Task, group_collator, register_task
from .ranker import check_ranker_record, ranker_metrics, ranker_stats

LATE_KEYS = ("input_ids", "attention_mask", "rank_label", "rank_teacher", "rank_query")


def featurize_late_ranker(model: LateRankerModel, records: list[dict], max_length: int) -> list[dict]:
    """One feature per group. Chunks are read as the loop hands them over: :func:`effrag.text.chunk_text`'s words,
    joined by spaces."""
    texts = [chunk_text(c["title"], c["text"]) for r in records for c in r["candidates"]]
    words = iter(words_batch(texts))
    feats = []
    for r in records:
        cands = r["candidates"]
        chunks = [" ".join(next(words)) for _ in cands]
        seqs = model.group_features(r["query"], chunks, [int(c["gold"]) for c in cands],
                                    [float(c.get("teacher", math.nan)) for c in cands], max_length)
        feats.append({"seqs": seqs, "length": sum(len(s["input_ids"]) for s in seqs)})
    return feats


register_task(Task(
    name="late_ranker",
    model_cls=LateRankerModel,
    check_record=check_ranker_record,
    featurize=featurize_late_ranker,
    stat_names=["top1", "reciprocal_rank", "gold_in_top3", "loss_sum", "n"],
    batch_stats=ranker_stats,
    summarize=ranker_metrics,
    default_metric="mrr",
    collate=group_collator(LATE_KEYS),
))
