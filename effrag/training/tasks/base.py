"""The Task record, the registry, and the token statistics every word-tagging task shares."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from ...models.tokenization import IGNORE, pad_batch


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


class GroupCollator:
    """A batch of groups of sequences (IRRR's steps, the ranker's candidate groups) -> one padded batch of the
    sequences, ``rank_group`` = each sequence's group in the batch (and ``group``, the groups' own ids, when the
    features carry them). ``keys``: a sequence's fields kept; a field a sequence leaves None is left out."""

    def __init__(self, keys: Sequence[str], pad_token_id: int, pad_values: dict | None = None):
        self.keys, self.pad_token_id = tuple(keys), pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        flat, group = [], []
        for i, f in enumerate(features):
            for s in f["seqs"]:
                flat.append({k: s[k] for k in self.keys if s.get(k) is not None})
                group.append(i)
        batch = pad_batch(flat, self.pad_token_id)
        batch["rank_group"] = torch.tensor(group, dtype=torch.long)
        if "group" in features[0]:
            batch["group"] = torch.tensor([f["group"] for f in features], dtype=torch.long)
        return batch


def group_collator(keys: Sequence[str]) -> Callable:
    """A :attr:`Task.collate` for features that are groups of sequences with these ``keys``."""
    return partial(GroupCollator, tuple(keys))


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


