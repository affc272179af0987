"""What a training run is built from before its first step (:func:`effrag.training.loop.train` puts it together).

The checks that need no model (``preflight``: data files, UTF-8, the encoder), the ``Accelerator`` (devices,
processes, mixed precision, gradient accumulation), whether its distributed type can be checkpointed, the model
(a task's model from an encoder or a saved checkpoint, frozen parameters), AdamW's parameter groups, the
schedule's length and what ``run_info.json`` records.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

from ..models.model_files import is_checkpoint
from ..provenance import file_sha256, package_versions
from .config import Config, ConfigError, TrainConfig, check_encoder
from .data import check_utf8
from .hf_data import data_exists, describe, is_arrow_source
from .tasks import Task


def preflight(cfg: Config) -> None:
    """Errors that need no model (before any heavy work or any write): missing data files, bytes in a JSONL
    data file that are not UTF-8 (file:line), an encoder that is not here."""
    d = cfg.data
    if not d.train_file:
        raise ConfigError("data.train_file is not set")
    for key, f in [("data.train_file", d.train_file)] + [("data.eval_files", f) for f in d.eval_files]:
        if not data_exists(f):
            raise ConfigError(f"{key}: file not found: {f} (a JSONL file or an Arrow dataset folder / .arrow file)")
        if Path(f).is_file() and not is_arrow_source(f):
            check_utf8(f)
    if not is_checkpoint(cfg.model.name_or_path):
        check_encoder(cfg.model.name_or_path, "model")


def make_accelerator(cfg: Config):
    from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs

    tc = cfg.train
    if tc.report_to not in ("none", "wandb"):
        raise ConfigError(f"train.report_to must be 'none' or 'wandb', got {tc.report_to!r}")
    if tc.report_to == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("train.report_to: wandb needs the wandb package: pip install 'effrag[wandb]' "
                              "(set WANDB_MODE=offline to log without a network)") from None
    if tc.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("train.mixed_precision: fp16 needs a GPU; use bf16 (or no) on CPU")
    handlers = []
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    if cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        handlers.append(InitProcessGroupKwargs(backend="gloo"))  # NCCL is GPU-only; DeepSpeed on CPU needs gloo
    precision = tc.mixed_precision
    if precision == "bf16" and cpu:
        from ..hardware import resolve_bf16

        precision = "bf16" if resolve_bf16(True, "cpu") else "no"  # emulated bf16 is 10-20x slower than fp32
    return Accelerator(
        gradient_accumulation_steps=tc.grad_accum,
        mixed_precision=precision,
        log_with="wandb" if tc.report_to == "wandb" else None,
        project_dir=tc.output_dir,
        kwargs_handlers=handlers,
        # seed + epoch fix each epoch's order, so a resumed run sees the same batches
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


def checkpoints_supported(accelerator) -> bool:
    """DeepSpeed, FSDP and Megatron keep their own sharded state, saved only as pickles: not checkpointed."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP,
                                                DistributedType.MEGATRON_LM)


def build_model(task: Task, cfg: Config):
    model = _build_model(task, cfg)
    frozen = [n for n, p in model.encoder.named_parameters() if any(n.startswith(f) for f in cfg.model.freeze)]
    unmatched = [f for f in cfg.model.freeze if not any(n.startswith(f) for n in frozen)]
    if unmatched:
        raise ConfigError(f"model.freeze: {unmatched} name no parameter of the encoder")
    for n, p in model.encoder.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    return model


def _build_model(task: Task, cfg: Config):
    mc = cfg.model
    options = {"max_length": mc.max_length, "head_dropout": mc.head_dropout, "token_weight": mc.token_weight,
               "tag_weight": mc.tag_weight, "token_class_weights": mc.token_class_weights, **mc.extra_options}
    if is_checkpoint(mc.name_or_path):
        # continue from a saved model of this task: its encoder AND heads, with this run's options
        saved = task.model_cls.from_pretrained(mc.name_or_path, attention_dropout=mc.attention_dropout,
                                               hidden_dropout=mc.hidden_dropout)
        model = task.model_cls(saved.encoder, saved.tokenizer, options)
        model.load_state_dict(saved.state_dict())
        model.base_encoder = saved.base_encoder_alias()
    else:
        check_encoder(mc.name_or_path, "model")
        model = task.model_cls.from_encoder(mc.name_or_path, options, attention_dropout=mc.attention_dropout,
                                            hidden_dropout=mc.hidden_dropout)
    if mc.num_layers is not None:
        model.keep_first_layers(mc.num_layers)
    if mc.gradient_checkpointing:
        model.encoder.gradient_checkpointing_enable()
    return model


def optimizer_groups(model, weight_decay: float) -> list[dict]:
    """Decay everything but biases and normalisation weights (the usual BERT recipe)."""
    no_decay = set()
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            if p_name == "bias" or "norm" in type(mod).__name__.lower():
                no_decay.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in params if n not in no_decay], "weight_decay": weight_decay},
            {"params": [p for n, p in params if n in no_decay], "weight_decay": 0.0}]


def schedule_lengths(train_examples: int, tc: TrainConfig, num_processes: int) -> dict:
    """How long a run is: batches per process and epoch, optimizer steps per epoch, total steps, epochs and
    warm-up steps. The schedule is built on the raw optimizer before ``prepare()`` and stepped once per optimizer
    step, so its length does not depend on how accelerate counts processes."""
    batches_per_process = math.ceil(math.ceil(train_examples / tc.batch_size) / num_processes)
    steps_per_epoch = math.ceil(batches_per_process / tc.grad_accum)
    total_steps = tc.max_steps or max(1, math.ceil(tc.epochs * steps_per_epoch))
    num_epochs = math.ceil(total_steps / steps_per_epoch)
    warmup = tc.warmup_steps if tc.warmup_steps is not None else int(tc.warmup_ratio * total_steps)
    return {"batches_per_process": batches_per_process, "steps_per_epoch": steps_per_epoch,
            "total_steps": total_steps, "num_epochs": num_epochs, "warmup": warmup}


def run_info(cfg: Config, accelerator) -> dict:
    from .. import __version__

    files = [cfg.data.train_file, *cfg.data.eval_files]
    return {
        "seed": cfg.train.seed,
        "command": sys.argv,
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "mixed_precision": accelerator.mixed_precision,
        "versions": {**package_versions(), "effrag": __version__},
        "data_sha256": {f: file_sha256(f) for f in files if f and Path(f).is_file()},
        "data_arrow": {f: describe(f, cfg.task) for f in files if f and is_arrow_source(f)},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
