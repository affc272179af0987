"""EfficientRAG's two tasks: the Labeler (token head + <Continue>/<Terminate> chunk head) and the Filter."""
from __future__ import annotations

import torch

from ...models import FilterModel, LabelerModel
from ...text import words_batch
from ..data import check_filter_record, check_labeler_record
from .base import TOKEN_STATS, Task, ratio, register_task, token_metrics, token_stats


# -- labeler ---------------------------------------------------------------------------------------
def featurize_labeler(model, records: list[dict], max_length: int) -> list[dict]:
    enc = model.encode(words_batch([r["query"] for r in records]), [r["chunk_words"] for r in records],
                       [r["labels"] for r in records], max_length=max_length)
    return [{**e.features(), "tag": int(r["tag"])} for e, r in zip(enc, records)]


def labeler_stats(out, batch) -> torch.Tensor:
    tag_pred = out.tag_logits.float().argmax(-1)
    tag = batch["tag"]
    tag_ce = torch.nn.functional.cross_entropy(out.tag_logits.float(), tag, reduction="none")
    extra = torch.stack([(tag_pred == tag).float(), ((tag_pred == 1) & (tag == 1)).float(),
                         (tag_pred == 1).float(), (tag == 1).float(), tag_ce, torch.ones_like(tag_ce)], 1)
    return torch.cat([token_stats(out.token_logits, batch["labels"]), extra], 1)


def labeler_metrics(s: dict) -> dict:
    p, r = ratio(s["tag_tp"], s["tag_pred"]), ratio(s["tag_tp"], s["tag_gold"])
    return {**token_metrics(s), "tag_accuracy": ratio(s["tag_correct"], s["n"]),
            "tag_continue_f1": ratio(2 * p * r, p + r), "tag_loss": ratio(s["tag_loss_sum"], s["n"]), "n": s["n"]}


register_task(Task(
    name="labeler",
    model_cls=LabelerModel,
    check_record=check_labeler_record,
    featurize=featurize_labeler,
    stat_names=TOKEN_STATS + ["tag_correct", "tag_tp", "tag_pred", "tag_gold", "tag_loss_sum", "n"],
    batch_stats=labeler_stats,
    summarize=labeler_metrics,
    default_metric="token_f1",
))


# -- filter ----------------------------------------------------------------------------------------
def featurize_filter(model, records: list[dict], max_length: int) -> list[dict]:
    enc = model.encode([r["words"] for r in records], [r["labels"] for r in records], max_length=max_length)
    return [e.features() for e in enc]


def filter_stats(out, batch) -> torch.Tensor:
    st = token_stats(out.token_logits, batch["labels"])
    return torch.cat([st, torch.ones_like(st[:, :1])], 1)


def filter_metrics(s: dict) -> dict:
    # exact_match: every visible word of the input labelled right, i.e. the next-hop query is exact
    return {**token_metrics(s), "exact_match": ratio(s["all_correct"], s["n"]), "n": s["n"]}


register_task(Task(
    name="filter",
    model_cls=FilterModel,
    check_record=check_filter_record,
    featurize=featurize_filter,
    stat_names=TOKEN_STATS + ["n"],
    batch_stats=filter_stats,
    summarize=filter_metrics,
    default_metric="token_f1",
))
