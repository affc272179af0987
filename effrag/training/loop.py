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

What the loop is built from (accelerator, model, optimizer groups, schedule length, preflight checks) is
:mod:`.build`; evaluation (during training and ``evaluate_only``) is :mod:`.evaluate`.
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
from .checkpoint_files import read_checkpoint, seal_checkpoint, write_checkpoint
from .checkpoints import RESULTS_NAME, checkpoint_dirs, config_changes, main_print, plan_start, prepare_output_dir
from .config import Config, ConfigError, save_config
from .data import Collator, LengthGroupedSampler
from .evaluate import evaluate, evaluate_only, param_checksums
from .task_data import build_eval_dataset, build_train_dataset, train_lengths
from .tasks import get_task

# the loop's parts, importable from here as before the split
__all__ = ["train", "evaluate_only", "evaluate", "build_model", "make_accelerator", "optimizer_groups",
           "param_checksums", "preflight", "run_info", "schedule_lengths"]


def train(cfg: Config, overwrite: bool = False) -> dict:
    """Train ``cfg.task`` as configured; returns (and writes) ``results.json``'s content.

    Into an output directory that already holds a run: resumes from its latest checkpoint, or returns
    a finished run's results without training; ``overwrite`` clears it first (see ``plan_start``).
    """
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    task = get_task(cfg.task)
    tc = cfg.train
    out_dir = Path(tc.output_dir)
    mode, ckpt, ckpt_state = plan_start(cfg, overwrite)
    if mode == "finished":
        try:
            results = json.loads((out_dir / RESULTS_NAME).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ConfigError(f"{out_dir / RESULTS_NAME}: unreadable ({' '.join(str(e).split())}); "
                              "--overwrite trains the run again") from None
        main_print(f"{out_dir} is a finished run (step {results.get('global_step')} of {results.get('total_steps')}, "
                    f"{RESULTS_NAME} is there): nothing to train; --overwrite trains it again from step 0")
        return results
    preflight(cfg)
    accelerator = make_accelerator(cfg)
    checkpointing = checkpoints_supported(accelerator)
    if ckpt is not None and not checkpointing:
        raise ConfigError(f"{ckpt}: resuming under {accelerator.distributed_type} is not supported (its sharded "
                          "state is only saved as pickles); --overwrite trains from step 0")
    if not checkpointing:
        accelerator.print(f"warning: no checkpoints under {accelerator.distributed_type} (its sharded state is only "
                          "saved as pickles, which effrag never loads): a killed run starts again from step 0")
    accelerator.wait_for_everyone()  # every process has planned before the main one changes the directory
    if accelerator.is_main_process:
        prepare_output_dir(out_dir, mode, ckpt_state["global_step"] if ckpt_state else 0)
    accelerator.wait_for_everyone()
    if tc.torch_threads:
        torch.set_num_threads(tc.torch_threads)
    set_seed(tc.seed)
    t_start = time.time()

    model = build_model(task, cfg)
    train_ds = build_train_dataset(task, model, cfg, accelerator)
    eval_ds = build_eval_dataset(task, model, cfg, cfg.data.eval_files)
    collate = (task.collate or Collator)(model.tokenizer.pad_token_id, task.pad_values)
    sampler = LengthGroupedSampler(train_lengths(train_ds), tc.batch_size, tc.seed) if tc.group_by_length else None
    # Each DataLoader draws a seed every time it is iterated; from its own generator, not the global one,
    # so a resumed run (whose epoch iterator starts mid-epoch) sees the same dropout masks as an unbroken
    # one, and evaluating does not change training. The shuffled order itself is the seedable sampler's.
    train_dl = DataLoader(train_ds, batch_size=tc.batch_size, shuffle=sampler is None, sampler=sampler,
                          collate_fn=collate, num_workers=tc.num_workers,
                          generator=torch.Generator().manual_seed(tc.seed))
    eval_dl = DataLoader(eval_ds, batch_size=tc.eval_batch_size, collate_fn=collate,
                         generator=torch.Generator().manual_seed(tc.seed)) if eval_ds else None
    optimizer = torch.optim.AdamW(optimizer_groups(model, tc.weight_decay), lr=tc.lr,
                                  betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps)
    # the schedule is built on the raw optimizer before prepare() and stepped by us once per optimizer
    # step (it is not prepared), so its length does not depend on how accelerate counts processes
    lengths = schedule_lengths(len(train_ds), tc, accelerator.num_processes)
    batches_per_process, total_steps, num_epochs = (lengths["batches_per_process"], lengths["total_steps"],
                                                    lengths["num_epochs"])
    scheduler = get_scheduler(tc.scheduler, optimizer, num_warmup_steps=lengths["warmup"],
                              num_training_steps=total_steps)
    model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)
    if len(train_dl) != batches_per_process:
        raise RuntimeError(f"expected {batches_per_process} batches per process, accelerate made {len(train_dl)}")
    if eval_dl is not None:
        eval_dl = accelerator.prepare(eval_dl)
    metric_name = tc.metric_for_best or task.default_metric

    state = {"global_step": 0, "epoch": 0, "batch_in_epoch": 0, "best_metric": None, "best_step": None}
    # the train loss summed since the last log line (per process), restored so that the next line averages
    # the same batches as in an unbroken run
    loss_sum = torch.zeros((), device=accelerator.device)
    loss_n = 0
    resumed = None
    if ckpt is not None:
        if not 0 <= ckpt_state["global_step"] <= total_steps:  # a hand-edited step would "finish" at once
            from .checkpoint_files import REFUSED, STATE_NAME, CheckpointError

            raise CheckpointError(f"{ckpt / STATE_NAME}: global_step {ckpt_state['global_step']} is outside this "
                                  f"run's 0..{total_steps} steps; {REFUSED}")
        read_checkpoint(ckpt, accelerator, model, optimizer, scheduler)  # weights, optimizer, schedule, RNG
        state = {k: v for k, v in ckpt_state.items() if k not in ("format", "files")}
        accelerator.step = state.pop("accelerator_step", accelerator.step)  # where gradient accumulation stands
        acc = state.pop("loss_accumulator", None)
        if acc and len(acc["sum_per_process"]) == accelerator.num_processes:
            loss_sum.fill_(acc["sum_per_process"][accelerator.process_index])
            loss_n = acc["batches"]
        elif acc:
            accelerator.print(f"warning: the checkpoint was written by {len(acc['sum_per_process'])} processes, this "
                              f"run has {accelerator.num_processes}: batches and results differ from an unbroken run")
        sampler_state = state.pop("sampler", None)
        if sampler is not None and sampler_state:
            sampler.load_state_dict(sampler_state)
        resumed = {"checkpoint": str(ckpt), "step": state["global_step"], "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        accelerator.print(f"resuming from checkpoint {ckpt} at step {state['global_step']} of {total_steps} "
                          f"(epoch {state['epoch']}, batch {state['batch_in_epoch']}); log.jsonl cut to step "
                          f"{state['global_step']}" + ("" if tc.resume_from_checkpoint else "; --overwrite starts afresh"))
        changes = config_changes(ckpt, cfg)
        if changes is None:
            accelerator.print(f"warning: {ckpt / 'config.yaml'} is missing or unreadable: this run's settings cannot "
                              "be compared with the checkpoint's")
        elif changes:
            accelerator.print("warning: this run's settings differ from the checkpoint's (the result will not "
                              "match an unbroken run): " + "; ".join(changes))
    elif mode == "overwrite":
        accelerator.print(f"--overwrite: cleared {out_dir}; training from step 0")
    info = run_info(cfg, accelerator)
    if resumed:
        try:
            before = json.loads((out_dir / "run_info.json").read_text())
        except (OSError, ValueError):
            before = {}
        info["started"] = before.get("started", info["started"])
        info["resumed"] = [*before.get("resumed", []), resumed]
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out_dir / "config.yaml")
        write_text_atomic(out_dir / "run_info.json", json.dumps(info, indent=2) + "\n")
    if tc.report_to != "none":
        accelerator.init_trackers(tc.project, config=cfg.to_dict(),
                                  init_kwargs={"wandb": {"name": tc.run_name, "dir": str(out_dir)}})
    # what the checkpoint's effrag_config.json records: paths relative to the repo or a named root (a model card
    # that ships must not show this machine's folders); config.yaml and run_info.json keep the run's own paths
    training_ref = portable({"config": cfg.to_dict(), "run_info": info})

    def log(record: dict) -> None:
        if accelerator.is_main_process:
            with open(out_dir / "log.jsonl", "a") as f:
                f.write(json.dumps({"step": state["global_step"], **record}) + "\n")
        accelerator.log(record, step=state["global_step"])

    def save_model(path: Path, metrics: dict | None) -> None:
        state_dict = accelerator.get_state_dict(model)  # collective under ZeRO-3
        if accelerator.is_main_process:
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict, training=training_ref)
            write_text_atomic(tmp / "metrics.json", json.dumps({"step": state["global_step"], **(metrics or {})},
                                                               indent=2))
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        accelerator.wait_for_everyone()

    def save_checkpoint() -> None:
        if not checkpointing:
            return
        ckpt = out_dir / "checkpoints" / f"step_{state['global_step']:07d}"
        sums = accelerator.gather(loss_sum.detach().float().reshape(1)).cpu().tolist()  # collective
        write_checkpoint(ckpt, accelerator, model, optimizer, scheduler)
        if accelerator.is_main_process:
            save_config(cfg, ckpt / "config.yaml")
            full = {**state, "loss_accumulator": {"sum_per_process": sums, "batches": loss_n},
                    "accelerator_step": accelerator.step}
            if sampler is not None:
                full["sampler"] = sampler.state_dict()
            seal_checkpoint(ckpt, full)  # last and atomic: a checkpoint without it is incomplete
            old = checkpoint_dirs(out_dir)
            for stale in old[: max(0, len(old) - max(1, tc.save_total_limit))]:
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()

    def run_eval() -> dict:
        if eval_dl is None:
            return {}
        metrics = evaluate(accelerator, model, eval_dl, task, eval_ds.groups)
        if metric_name not in metrics:
            raise ConfigError(f"train.metric_for_best {metric_name!r} is not an eval metric; have {sorted(metrics)}")
        log({f"eval/{k}": v for k, v in metrics.items()})
        value, best = metrics[metric_name], state["best_metric"]
        if best is None or (value > best if tc.greater_is_better else value < best):
            state["best_metric"], state["best_step"] = value, state["global_step"]
            save_model(out_dir / "best", metrics)
        accelerator.print(f"step {state['global_step']}: {metric_name}={value:.4f} (best {state['best_metric']:.4f})")
        return metrics

    bar = tqdm(total=total_steps, initial=state["global_step"], desc=f"train {task.name}",
               disable=not accelerator.is_local_main_process)
    model.train()
    t_train, seen, last_metrics = time.time(), 0, {}
    done = state["global_step"] >= total_steps
    for epoch in range(state["epoch"], num_epochs):
        if done:
            break
        train_dl.set_epoch(epoch)
        skip = state["batch_in_epoch"] if epoch == state["epoch"] else 0
        batches = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        state["epoch"], state["batch_in_epoch"] = epoch, skip
        for batch in batches:
            with accelerator.accumulate(model):
                out = model(**batch)
                accelerator.backward(out.loss)
                if accelerator.sync_gradients and tc.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
            state["batch_in_epoch"] += 1
            seen += len(batch["input_ids"])
            loss_sum += out.loss.detach().float()
            loss_n += 1
            if not accelerator.sync_gradients:
                continue
            state["global_step"] += 1
            bar.update(1)
            if state["batch_in_epoch"] >= len(train_dl):
                state["epoch"], state["batch_in_epoch"] = epoch + 1, 0
            step = state["global_step"]
            done = step >= total_steps
            if step % tc.log_every == 0 or done:
                loss = accelerator.reduce(loss_sum / max(loss_n, 1), "mean").item()
                lr = scheduler.get_last_lr()[0]
                log({"train/loss": loss, "train/lr": lr, "train/epoch": state["epoch"] + state["batch_in_epoch"] / len(train_dl)})
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
                loss_sum.zero_()
                loss_n = 0
            if tc.eval_every and (step % tc.eval_every == 0 or done):
                last_metrics = run_eval()
            # at an epoch's end the checkpoint waits for the end-of-epoch eval below, so that a resumed run
            # does not skip it
            if tc.save_every and step % tc.save_every == 0 and not done and state["batch_in_epoch"] > 0:
                save_checkpoint()
            if done:
                break
        if not tc.eval_every:
            last_metrics = run_eval()
        if not done and state["batch_in_epoch"] == 0 and (not tc.save_every or state["global_step"] % tc.save_every == 0):
            save_checkpoint()
    bar.close()
    train_time = time.time() - t_train

    sums = accelerator.gather(param_checksums(accelerator.unwrap_model(model)).to(accelerator.device))
    sums = sums.view(accelerator.num_processes, -1).cpu()
    ds = accelerator.state.deepspeed_plugin
    # under ZeRO-3 each rank holds a different shard: replicas are not comparable
    in_sync = None if ds is not None and ds.zero_stage == 3 else bool(all(torch.equal(sums[0], s) for s in sums[1:]))
    if eval_dl is not None and state["best_metric"] is None:
        last_metrics = run_eval()
    if tc.save_last or eval_dl is None:
        save_model(out_dir / "last", last_metrics)
    results = {
        "task": task.name, "global_step": state["global_step"], "total_steps": total_steps,
        "lr": scheduler.get_last_lr()[0], "metric_for_best": metric_name, "best_metric": state["best_metric"],
        "best_step": state["best_step"], "eval": last_metrics, "train_examples": len(train_ds),
        "examples_seen_per_process": seen, "train_time_s": round(train_time, 1),
        "wall_time_s": round(time.time() - t_start, 1), "num_processes": accelerator.num_processes,
        "param_checksums": [float(r.sum()) for r in sums], "ranks_in_sync": in_sync,
    }
    if in_sync is False:
        accelerator.print("WARNING: model parameters differ across processes")
    if accelerator.is_main_process:
        # atomic: a kill while writing it leaves an unfinished run
        write_text_atomic(out_dir / RESULTS_NAME, json.dumps(results, indent=2) + "\n")
    accelerator.end_training()
    return results
