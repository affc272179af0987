"""The Task record, the registry, and the token statistics every word-tagging task shares."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ...models.tokenization import IGNORE


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


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def token_metrics(s: dict) -> dict:
    p, r = ratio(s["tp"], s["tp"] + s["fp"]), ratio(s["tp"], s["tp"] + s["fn"])
    n_tok = s["tp"] + s["fp"] + s["fn"] + s["tn"]
    return {
        "token_precision": p,
        "token_recall": r,
        "token_f1": ratio(2 * p * r, p + r),
        "token_accuracy": ratio(s["tp"] + s["tn"], n_tok),
        "token_positive_rate": ratio(s["tp"] + s["fn"], n_tok),
        "token_loss": ratio(s["token_loss_sum"], n_tok),
        "n_words": n_tok,
    }


