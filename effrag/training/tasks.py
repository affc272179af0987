"""Task registry: what the one training loop needs to know about each model type.

A :class:`Task` ties a model class to its data (read + validate + featurize JSONL
records) and its metrics. The model class provides ``from_encoder(name_or_path, options,
attention_dropout=, hidden_dropout=, gradient_checkpointing=)``, ``from_pretrained(dir)``,
``save_pretrained(dir, state_dict=, training=)``, ``.tokenizer`` and a ``forward`` returning an
object with ``.loss`` (see ``effrag.models.heads.EncoderWithHeads``). Metrics are computed from *per-example* statistics
(a ``[batch, len(stat_names)]`` tensor) so the loop can gather them across
processes with ``gather_for_metrics`` (which drops the padding duplicates of the
last batch) and sum them, overall and per group (dataset). IRRR or any other
model registers a Task the same way and is trained by the same ``train.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..models import FilterModel, LabelerModel
from ..models.tokenization import IGNORE
from ..text import words_batch
from .data import check_filter_record, check_labeler_record


@dataclass
class Task:
    name: str
    model_cls: type
    check_record: Callable[[dict, str], None]
    featurize: Callable  # (model, records, max_length) -> list[feature dict]
    stat_names: list[str]
    batch_stats: Callable  # (model output, batch) -> Tensor[B, len(stat_names)]
    summarize: Callable  # (dict stat name -> summed value) -> dict metric -> float
    default_metric: str
    pad_values: dict = field(default_factory=dict)  # pad value of each extra per-token feature field
    # (pad_token_id, pad_values) -> collate_fn, for tasks whose feature is not one sequence (IRRR)
    collate: Callable | None = None


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; registered tasks: {sorted(TASKS)}")
    return TASKS[name]


# -- shared token statistics ---------------------------------------------------------------------
TOKEN_STATS = ["tp", "fp", "fn", "tn", "token_loss_sum", "all_correct"]


def token_stats(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example [tp, fp, fn, tn, summed CE, all-labelled-words-correct] on the positive class."""
    logits = logits.float()
    pred = logits.argmax(-1)
    m = labels != IGNORE
    pos, gold = (pred == 1) & m, (labels == 1) & m
    ce = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none"
    ).sum(1)
    wrong = ((pred != labels) & m).sum(1)
    cols = [(pos & gold).sum(1), (pos & ~gold).sum(1), (~pos & gold).sum(1), (~pos & ~gold & m).sum(1), ce, wrong == 0]
    return torch.stack([c.float() for c in cols], 1)


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def token_metrics(s: dict) -> dict:
    p, r = _ratio(s["tp"], s["tp"] + s["fp"]), _ratio(s["tp"], s["tp"] + s["fn"])
    n_tok = s["tp"] + s["fp"] + s["fn"] + s["tn"]
    return {
        "token_precision": p,
        "token_recall": r,
        "token_f1": _ratio(2 * p * r, p + r),
        "token_accuracy": _ratio(s["tp"] + s["tn"], n_tok),
        "token_positive_rate": _ratio(s["tp"] + s["fn"], n_tok),
        "token_loss": _ratio(s["token_loss_sum"], n_tok),
        "n_words": n_tok,
    }


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
    p, r = _ratio(s["tag_tp"], s["tag_pred"]), _ratio(s["tag_tp"], s["tag_gold"])
    return {**token_metrics(s), "tag_accuracy": _ratio(s["tag_correct"], s["n"]),
            "tag_continue_f1": _ratio(2 * p * r, p + r), "tag_loss": _ratio(s["tag_loss_sum"], s["n"]), "n": s["n"]}


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
    return {**token_metrics(s), "exact_match": _ratio(s["all_correct"], s["n"]), "n": s["n"]}


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


# IRRR registers its task from its own package (imported last: it builds on the helpers above).
from ..irrr import task as _irrr_task  # noqa: E402,F401
