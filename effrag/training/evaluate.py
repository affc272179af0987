"""Evaluation during and after training: a task's metrics over an eval set gathered across processes (overall and
per data group), a saved model evaluated alone (``train.py --eval_only``), and the per-tensor checksums that
show whether the processes' replicas agree at the end of a run."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..state_files import write_text_atomic
from .build import make_accelerator
from .config import Config, ConfigError
from .data import Collator
from .task_data import build_eval_dataset
from .tasks import Task, get_task


@torch.no_grad()
def evaluate(accelerator, model, dataloader, task: Task, group_names: list[str]) -> dict:
    """Task metrics over the whole eval set (all processes), overall and per group."""
    was_training = model.training
    model.eval()
    rows = []
    for batch in dataloader:
        group = batch.pop("group")
        stats = task.batch_stats(model(**batch), batch)
        rows.append(accelerator.gather_for_metrics(torch.cat([stats.float(), group[:, None].float()], 1)))
    model.train(was_training)
    table = torch.cat(rows).double()
    names = task.stat_names

    def summarize(t):
        return task.summarize({n: float(v) for n, v in zip(names, t[:, : len(names)].sum(0))})

    metrics = summarize(table)
    if len(group_names) > 1:
        for g, name in enumerate(group_names):
            sub = table[table[:, -1] == g]
            if len(sub):
                metrics.update({f"{name}/{k}": v for k, v in summarize(sub).items()})
    return metrics


def param_checksums(model) -> torch.Tensor:
    """Per-tensor (sum, sum of squares) in float64: equal across ranks iff the replicas agree."""
    vals = []
    for p in model.parameters():
        d = p.detach().double()
        vals += [d.sum(), (d * d).sum()]
    return torch.stack(vals)


def evaluate_only(cfg: Config, model_dir: str) -> dict:
    """Evaluate a saved model directory on ``data.eval_files``; writes ``<output_dir>/eval_metrics.json``."""
    task = get_task(cfg.task)
    accelerator = make_accelerator(cfg)
    model = task.model_cls.from_pretrained(model_dir)
    eval_ds = build_eval_dataset(task, model, cfg, cfg.data.eval_files)
    if eval_ds is None:
        raise ConfigError("data.eval_files is empty: nothing to evaluate")
    collate = (task.collate or Collator)(model.tokenizer.pad_token_id, task.pad_values)
    dl = DataLoader(eval_ds, batch_size=cfg.train.eval_batch_size, collate_fn=collate)
    model, dl = accelerator.prepare(model, dl)
    t0 = time.time()
    metrics = evaluate(accelerator, model, dl, task, eval_ds.groups)
    metrics["eval_time_s"] = round(time.time() - t0, 1)
    if accelerator.is_main_process:
        out = Path(cfg.train.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "eval_metrics.json", json.dumps({"model": str(model_dir), **metrics}, indent=2) + "\n")
    return metrics
