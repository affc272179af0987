"""The one training loop (in the style of transformers' run_ner_no_trainer.py).

``Accelerator`` owns devices, processes (DDP / DeepSpeed via ``accelerate config``),
mixed precision and gradient accumulation. The loop adds what the paper recipe and
reproducibility need: AdamW with no-decay groups, a warm-up schedule stepped once
per optimizer step, evaluation every N steps gathered across processes, best-model
selection, resumable checkpoints that skip already-seen batches, and the resolved
config + versions + data hashes beside every output.

Output directory::

    config.yaml, run_info.json, log.jsonl, results.json
    checkpoints/step_0000200/   safetensors + JSON state, trainer_state.json with file hashes (checkpoint_files.py)
    best/, last/                save_pretrained model directories (+ metrics.json)

Rerunning a run into the same output directory (``plan_start``): a run that stopped resumes from
its latest checkpoint (one line says which, at which step), a finished run (``results.json``) is
left alone, ``overwrite=True`` (``train.py --overwrite``) clears the directory and starts afresh.
A resume truncates ``log.jsonl`` to the checkpoint's step and replays the rest exactly: weights,
optimizer, schedule, python/numpy/torch RNG (dropout), the epoch's data order and position in it,
the loss being averaged for the next log line; a killed and resumed run ends bit-identical to an
unbroken one on the same hardware and process count (docs/reliability.md, "Training resume").
Checkpoints are safetensors and JSON with recorded hashes, never pickles (:mod:`.checkpoint_files`).

``train`` plans the start and hands the rest to :class:`Run`, one method a part: ``setup`` (accelerator, output
directory, seed), ``build`` (model, data, optimizer, schedule), ``resume``, ``record_start``, ``fit`` (``epoch``,
``step``, ``after_update``), ``evaluate``, ``save_checkpoint``, ``save_model`` and ``finish``. What the loop is built
from (accelerator, model, optimizer groups, schedule length, preflight checks) is :mod:`.build`; evaluation (during
training and ``evaluate_only``) is :mod:`.evaluate`.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..provenance import portable
from ..state_files import write_text_atomic
from .build import (
    build_model,
    checkpoints_supported,
    make_accelerator,
    optimizer_groups,
    preflight,
    run_info,
    schedule_lengths,
)
from .checkpoint_files import REFUSED, STATE_NAME, CheckpointError, read_checkpoint, seal_checkpoint, write_checkpoint
from .checkpoints import (
    RESULTS_NAME,
    checkpoint_dirs,
    config_changes,
    finished_results,
    plan_start,
    prepare_output_dir,
)
from .config import Config, ConfigError, save_config
from .data import Collator, LengthGroupedSampler
from .evaluate import evaluate, evaluate_only, param_checksums
from .task_data import build_eval_dataset, build_train_dataset, train_lengths
from .tasks import get_task

# the loop's parts, importable from here as before the split
__all__ = ["train", "Run", "evaluate_only", "evaluate", "build_model", "make_accelerator", "optimizer_groups",
           "param_checksums", "preflight", "run_info", "schedule_lengths"]


def train(cfg: Config, overwrite: bool = False) -> dict:
    """Train ``cfg.task`` as configured; returns (and writes) ``results.json``'s content.

    Into an output directory that already holds a run: resumes from its latest checkpoint, or returns
    a finished run's results without training; ``overwrite`` clears it first (see ``plan_start``).
    """
    run = Run(cfg)
    mode, ckpt, ckpt_state = plan_start(cfg, overwrite)
    if mode == "finished":
        return finished_results(run.out_dir)
    return run.run(mode, ckpt, ckpt_state)


class Run:
    """One training run into ``cfg.train.output_dir``, from its first step or a checkpoint's to ``results.json``.

    The methods run in the order of :meth:`run`; that order is the random number generators' order (model
    initialisation, then data, then the steps), which a resumed run and the tests of bit-identical resumes rely on.
    ``state`` is what a checkpoint's ``trainer_state.json`` records of the progress: ``global_step``, ``epoch``,
    ``batch_in_epoch`` (batches of that epoch already trained), ``best_metric`` and ``best_step``.
    """

    def __init__(self, cfg: Config):
        # the libraries are imported first, before the plan and the seed, so that no import can draw from a
        # seeded generator
        from accelerate.utils import set_seed
        from tqdm.auto import tqdm
        from transformers import get_scheduler

        self._set_seed, self._tqdm, self._get_scheduler = set_seed, tqdm, get_scheduler
        self.cfg, self.tc, self.task = cfg, cfg.train, get_task(cfg.task)
        self.out_dir = Path(self.tc.output_dir)
        self.state = {"global_step": 0, "epoch": 0, "batch_in_epoch": 0, "best_metric": None, "best_step": None}
        self.resumed: dict | None = None  # the run_info.json record of this resume, if it is one
        self.seen = 0  # examples trained on by this process in this invocation
        self.last_metrics: dict = {}

    def run(self, mode: str, ckpt: Path | None, ckpt_state: dict | None) -> dict:
        """The whole run, as ``plan_start`` planned it (``mode``: ``fresh``, ``resume`` or ``overwrite``)."""
        self.setup(mode, ckpt, ckpt_state)
        self.build()
        if ckpt is not None:
            self.resume(ckpt, ckpt_state)
        elif mode == "overwrite":
            self.accelerator.print(f"--overwrite: cleared {self.out_dir}; training from step 0")
        self.record_start()
        self.fit()
        return self.finish()

    @property
    def done(self) -> bool:
        return self.state["global_step"] >= self.total_steps

    # -- before the first step -------------------------------------------------------------------------------
    def setup(self, mode: str, ckpt: Path | None, ckpt_state: dict | None) -> None:
        """The checks that need no model, the accelerator, the output directory made ready, the global seed."""
        tc = self.tc
        preflight(self.cfg)
        self.accelerator = accelerator = make_accelerator(self.cfg)
        self.checkpointing = checkpoints_supported(accelerator)
        if ckpt is not None and not self.checkpointing:
            raise ConfigError(f"{ckpt}: resuming under {accelerator.distributed_type} is not supported (its sharded "
                              "state is only saved as pickles); --overwrite trains from step 0")
        if not self.checkpointing:
            accelerator.print(f"warning: no checkpoints under {accelerator.distributed_type} (its sharded state is "
                              "only saved as pickles, which effrag never loads): a killed run starts again from step 0")
        accelerator.wait_for_everyone()  # every process has planned before the main one changes the directory
        if accelerator.is_main_process:
            prepare_output_dir(self.out_dir, mode, ckpt_state["global_step"] if ckpt_state else 0)
        accelerator.wait_for_everyone()
        if tc.torch_threads:
            torch.set_num_threads(tc.torch_threads)
        self._set_seed(tc.seed)
        self.t_start = time.time()

    def build(self) -> None:
        """Model, datasets, data loaders, optimizer and schedule, prepared by the accelerator."""
        tc, task, accelerator = self.tc, self.task, self.accelerator
        model = build_model(task, self.cfg)  # the first draws from the seeded generators: initial weights
        self.train_ds = build_train_dataset(task, model, self.cfg, accelerator)
        self.eval_ds = build_eval_dataset(task, model, self.cfg, self.cfg.data.eval_files)
        collate = (task.collate or Collator)(model.tokenizer.pad_token_id, task.pad_values)
        self.sampler = (LengthGroupedSampler(train_lengths(self.train_ds), tc.batch_size, tc.seed)
                        if tc.group_by_length else None)
        # Each DataLoader draws a seed every time it is iterated; from its own generator, not the global one,
        # so a resumed run (whose epoch iterator starts mid-epoch) sees the same dropout masks as an unbroken
        # one, and evaluating does not change training. The shuffled order itself is the seedable sampler's.
        train_dl = DataLoader(self.train_ds, batch_size=tc.batch_size, shuffle=self.sampler is None,
                              sampler=self.sampler, collate_fn=collate, num_workers=tc.num_workers,
                              generator=torch.Generator().manual_seed(tc.seed))
        eval_dl = DataLoader(self.eval_ds, batch_size=tc.eval_batch_size, collate_fn=collate,
                             generator=torch.Generator().manual_seed(tc.seed)) if self.eval_ds else None
        optimizer = torch.optim.AdamW(optimizer_groups(model, tc.weight_decay), lr=tc.lr,
                                      betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps)
        # the schedule is built on the raw optimizer before prepare() and stepped by us once per optimizer
        # step (it is not prepared), so its length does not depend on how accelerate counts processes
        lengths = schedule_lengths(len(self.train_ds), tc, accelerator.num_processes)
        self.total_steps, self.num_epochs = lengths["total_steps"], lengths["num_epochs"]
        self.scheduler = self._get_scheduler(tc.scheduler, optimizer, num_warmup_steps=lengths["warmup"],
                                             num_training_steps=self.total_steps)
        self.model, self.optimizer, self.train_dl = accelerator.prepare(model, optimizer, train_dl)
        if len(self.train_dl) != lengths["batches_per_process"]:
            raise RuntimeError(f"expected {lengths['batches_per_process']} batches per process, accelerate made "
                               f"{len(self.train_dl)}")
        self.eval_dl = accelerator.prepare(eval_dl) if eval_dl is not None else None
        self.metric_name = tc.metric_for_best or task.default_metric
        # the train loss summed since the last log line (per process), restored by a resume so that the next
        # line averages the same batches as in an unbroken run
        self.loss_sum = torch.zeros((), device=accelerator.device)
        self.loss_n = 0

    def resume(self, ckpt: Path, ckpt_state: dict) -> None:
        """Weights, optimizer, schedule, RNG, progress, gradient accumulation, loss average and data order
        from checkpoint ``ckpt`` (its ``trainer_state.json`` read and checked by ``plan_start``)."""
        accelerator, tc = self.accelerator, self.tc
        if not 0 <= ckpt_state["global_step"] <= self.total_steps:  # a hand-edited step would "finish" at once
            raise CheckpointError(f"{ckpt / STATE_NAME}: global_step {ckpt_state['global_step']} is outside this "
                                  f"run's 0..{self.total_steps} steps; {REFUSED}")
        read_checkpoint(ckpt, accelerator, self.model, self.optimizer, self.scheduler)
        state = {k: v for k, v in ckpt_state.items() if k not in ("format", "files")}
        accelerator.step = state.pop("accelerator_step", accelerator.step)  # where gradient accumulation stands
        acc = state.pop("loss_accumulator", None)
        if acc and len(acc["sum_per_process"]) == accelerator.num_processes:
            self.loss_sum.fill_(acc["sum_per_process"][accelerator.process_index])
            self.loss_n = acc["batches"]
        elif acc:
            accelerator.print(f"warning: the checkpoint was written by {len(acc['sum_per_process'])} processes, this "
                              f"run has {accelerator.num_processes}: batches and results differ from an unbroken run")
        sampler_state = state.pop("sampler", None)
        if self.sampler is not None and sampler_state:
            self.sampler.load_state_dict(sampler_state)
        self.state = state
        self.resumed = {"checkpoint": str(ckpt), "step": state["global_step"],
                        "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        accelerator.print(f"resuming from checkpoint {ckpt} at step {state['global_step']} of {self.total_steps} "
                          f"(epoch {state['epoch']}, batch {state['batch_in_epoch']}); log.jsonl cut to step "
                          f"{state['global_step']}" + ("" if tc.resume_from_checkpoint else "; --overwrite starts afresh"))
        changes = config_changes(ckpt, self.cfg)
        if changes is None:
            accelerator.print(f"warning: {ckpt / 'config.yaml'} is missing or unreadable: this run's settings cannot "
                              "be compared with the checkpoint's")
        elif changes:
            accelerator.print("warning: this run's settings differ from the checkpoint's (the result will not "
                              "match an unbroken run): " + "; ".join(changes))

    def record_start(self) -> None:
        """``config.yaml`` and ``run_info.json`` (a resume keeps the first start and adds itself), the trackers."""
        cfg, tc, out_dir = self.cfg, self.tc, self.out_dir
        info = run_info(cfg, self.accelerator)
        if self.resumed:
            try:
                before = json.loads((out_dir / "run_info.json").read_text())
            except (OSError, ValueError):
                before = {}
            info["started"] = before.get("started", info["started"])
            info["resumed"] = [*before.get("resumed", []), self.resumed]
        if self.accelerator.is_main_process:
            out_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, out_dir / "config.yaml")
            write_text_atomic(out_dir / "run_info.json", json.dumps(info, indent=2) + "\n")
        if tc.report_to != "none":
            self.accelerator.init_trackers(tc.project, config=cfg.to_dict(),
                                           init_kwargs={"wandb": {"name": tc.run_name, "dir": str(out_dir)}})
        # what the checkpoint's effrag_config.json records: paths relative to the repo or a named root (a model
        # card that ships must not show this machine's folders); config.yaml and run_info.json keep the run's own
        self.training_ref = portable({"config": cfg.to_dict(), "run_info": info})

    # -- the steps ---------------------------------------------------------------------------------------------
    def fit(self) -> None:
        """The epochs from where ``state`` stands to ``total_steps``."""
        self.bar = self._tqdm(total=self.total_steps, initial=self.state["global_step"],
                              desc=f"train {self.task.name}", disable=not self.accelerator.is_local_main_process)
        self.model.train()
        t_train = time.time()
        for epoch in range(self.state["epoch"], self.num_epochs):
            if self.done:
                break
            self.epoch(epoch)
        self.bar.close()
        self.train_time = time.time() - t_train

    def epoch(self, epoch: int) -> None:
        """One epoch, or the rest of it: a resumed run skips the batches its checkpoint had already trained."""
        tc, state = self.tc, self.state
        self.train_dl.set_epoch(epoch)
        skip = state["batch_in_epoch"] if epoch == state["epoch"] else 0
        batches = self.accelerator.skip_first_batches(self.train_dl, skip) if skip else self.train_dl
        state["epoch"], state["batch_in_epoch"] = epoch, skip
        for batch in batches:
            if self.step(batch) and self.after_update(epoch):
                break
        if not tc.eval_every:
            self.last_metrics = self.evaluate()
        at_save = not tc.save_every or state["global_step"] % tc.save_every == 0
        if not self.done and state["batch_in_epoch"] == 0 and at_save:
            self.save_checkpoint()

    def step(self, batch: dict) -> bool:
        """Forward and backward on one batch; whether the optimizer stepped (the last batch of an accumulation)."""
        accelerator, tc = self.accelerator, self.tc
        with accelerator.accumulate(self.model):
            out = self.model(**batch)
            accelerator.backward(out.loss)
            if accelerator.sync_gradients and tc.max_grad_norm:
                accelerator.clip_grad_norm_(self.model.parameters(), tc.max_grad_norm)
            self.optimizer.step()
            if accelerator.sync_gradients:
                self.scheduler.step()
            self.optimizer.zero_grad()
        self.state["batch_in_epoch"] += 1
        self.seen += len(batch["input_ids"])
        self.loss_sum += out.loss.detach().float()
        self.loss_n += 1
        return accelerator.sync_gradients

    def after_update(self, epoch: int) -> bool:
        """After an optimizer step: count it, log, evaluate and checkpoint when due; whether the run is done."""
        tc, state = self.tc, self.state
        state["global_step"] += 1
        self.bar.update(1)
        if state["batch_in_epoch"] >= len(self.train_dl):
            state["epoch"], state["batch_in_epoch"] = epoch + 1, 0
        step, done = state["global_step"], self.done
        if step % tc.log_every == 0 or done:
            loss = self.accelerator.reduce(self.loss_sum / max(self.loss_n, 1), "mean").item()
            lr = self.scheduler.get_last_lr()[0]
            self.log({"train/loss": loss, "train/lr": lr,
                      "train/epoch": state["epoch"] + state["batch_in_epoch"] / len(self.train_dl)})
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
            self.loss_sum.zero_()
            self.loss_n = 0
        if tc.eval_every and (step % tc.eval_every == 0 or done):
            self.last_metrics = self.evaluate()
        # at an epoch's end the checkpoint waits for the end-of-epoch eval (in epoch()), so that a resumed run
        # does not skip it
        if tc.save_every and step % tc.save_every == 0 and not done and state["batch_in_epoch"] > 0:
            self.save_checkpoint()
        return done

    # -- evaluation and files ----------------------------------------------------------------------------------
    def log(self, record: dict) -> None:
        """One line of ``log.jsonl`` at the current step (main process), and the trackers."""
        if self.accelerator.is_main_process:
            with open(self.out_dir / "log.jsonl", "a") as f:
                f.write(json.dumps({"step": self.state["global_step"], **record}) + "\n")
        self.accelerator.log(record, step=self.state["global_step"])

    def evaluate(self) -> dict:
        """The eval metrics (none without eval data), logged; a new best is saved to ``best/``."""
        if self.eval_dl is None:
            return {}
        metrics = evaluate(self.accelerator, self.model, self.eval_dl, self.task, self.eval_ds.groups)
        name, state = self.metric_name, self.state
        if name not in metrics:
            raise ConfigError(f"train.metric_for_best {name!r} is not an eval metric; have {sorted(metrics)}")
        self.log({f"eval/{k}": v for k, v in metrics.items()})
        value, best = metrics[name], state["best_metric"]
        if best is None or (value > best if self.tc.greater_is_better else value < best):
            state["best_metric"], state["best_step"] = value, state["global_step"]
            self.save_model(self.out_dir / "best", metrics)
        self.accelerator.print(f"step {state['global_step']}: {name}={value:.4f} (best {state['best_metric']:.4f})")
        return metrics

    def save_model(self, path: Path, metrics: dict | None) -> None:
        """The model's ``save_pretrained`` directory and ``metrics.json``, written beside and swapped in whole."""
        accelerator = self.accelerator
        state_dict = accelerator.get_state_dict(self.model)  # collective under ZeRO-3
        if accelerator.is_main_process:
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            accelerator.unwrap_model(self.model).save_pretrained(tmp, state_dict=state_dict, training=self.training_ref)
            write_text_atomic(tmp / "metrics.json", json.dumps({"step": self.state["global_step"], **(metrics or {})},
                                                               indent=2))
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        accelerator.wait_for_everyone()

    def save_checkpoint(self) -> None:
        """``checkpoints/step_NNNNNNN``: what :meth:`resume` reads back, sealed last; the oldest beyond
        ``save_total_limit`` are removed. Nothing where the accelerator's state cannot be saved without pickles."""
        if not self.checkpointing:
            return
        accelerator = self.accelerator
        ckpt = self.out_dir / "checkpoints" / f"step_{self.state['global_step']:07d}"
        sums = accelerator.gather(self.loss_sum.detach().float().reshape(1)).cpu().tolist()  # collective
        write_checkpoint(ckpt, accelerator, self.model, self.optimizer, self.scheduler)
        if accelerator.is_main_process:
            save_config(self.cfg, ckpt / "config.yaml")
            full = {**self.state, "loss_accumulator": {"sum_per_process": sums, "batches": self.loss_n},
                    "accelerator_step": accelerator.step}
            if self.sampler is not None:
                full["sampler"] = self.sampler.state_dict()
            seal_checkpoint(ckpt, full)  # last and atomic: a checkpoint without it is incomplete
            old = checkpoint_dirs(self.out_dir)
            for stale in old[: max(0, len(old) - max(1, self.tc.save_total_limit))]:
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()

    def replica_checksums(self) -> tuple[torch.Tensor, bool | None]:
        """Each process's parameter checksums (one row each) and whether the replicas agree (None under ZeRO-3,
        where each rank holds a different shard)."""
        accelerator = self.accelerator
        sums = accelerator.gather(param_checksums(accelerator.unwrap_model(self.model)).to(accelerator.device))
        sums = sums.view(accelerator.num_processes, -1).cpu()
        ds = accelerator.state.deepspeed_plugin
        in_sync = None if ds is not None and ds.zero_stage == 3 else all(torch.equal(sums[0], s) for s in sums[1:])
        return sums, in_sync

    def finish(self) -> dict:
        """``last/`` (and an eval if none ran), ``results.json`` written last: the run is finished."""
        accelerator, state = self.accelerator, self.state
        sums, in_sync = self.replica_checksums()
        if self.eval_dl is not None and state["best_metric"] is None:
            self.last_metrics = self.evaluate()
        if self.tc.save_last or self.eval_dl is None:
            self.save_model(self.out_dir / "last", self.last_metrics)
        results = {
            "task": self.task.name, "global_step": state["global_step"], "total_steps": self.total_steps,
            "lr": self.scheduler.get_last_lr()[0], "metric_for_best": self.metric_name,
            "best_metric": state["best_metric"], "best_step": state["best_step"], "eval": self.last_metrics,
            "train_examples": len(self.train_ds), "examples_seen_per_process": self.seen,
            "train_time_s": round(self.train_time, 1), "wall_time_s": round(time.time() - self.t_start, 1),
            "num_processes": accelerator.num_processes, "param_checksums": [float(r.sum()) for r in sums],
            "ranks_in_sync": in_sync,
        }
        if in_sync is False:
            accelerator.print("WARNING: model parameters differ across processes")
        if accelerator.is_main_process:
            # atomic: a kill while writing it leaves an unfinished run
            write_text_atomic(self.out_dir / RESULTS_NAME, json.dumps(results, indent=2) + "\n")
        accelerator.end_training()
        return results
