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

One module per task family (``efficientrag``: labeler, filter; ``irrr``; ``reader``), imported when
a task of it is first asked for, so the registry depends on no task and no task on another.
"""
from __future__ import annotations

import importlib

from .base import TASKS, TOKEN_STATS, Task, ratio, register_task, token_metrics, token_stats

# task -> module here
BUILTIN = {"labeler": "efficientrag", "filter": "efficientrag", "irrr": "irrr", "reader": "reader", "ranker": "ranker",
           "late_ranker": "late_ranker"}


def get_task(name: str) -> Task:
    if name not in TASKS and name in BUILTIN:
        importlib.import_module(f"{__name__}.{BUILTIN[name]}")
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {sorted(set(TASKS) | set(BUILTIN))}")
    return TASKS[name]


__all__ = ["TASKS", "BUILTIN", "TOKEN_STATS", "Task", "get_task", "register_task", "ratio", "token_metrics",
           "token_stats"]
