"""Training configuration: YAML files + dotted command-line overrides -> typed, validated config.

A config file may name a ``base:`` file (relative to itself) whose values it
overrides, so the paper and CPU settings share one definition. Overrides look like
``--train.lr 1e-5`` or ``--data.eval_files a.jsonl,b.jsonl``; values are parsed as
YAML and coerced to the field's type (so ``5e-6`` is a float even though YAML 1.1
reads it as a string). Unknown keys are errors naming the file or the flag.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    name_or_path: str = "minilm"  # encoder alias, local dir, or an effrag checkpoint dir to continue from
    max_length: int = 256
    attention_dropout: float | None = None  # None keeps the encoder's value; 0.0 is ~faster on CPU
    hidden_dropout: float | None = None
    head_dropout: float = 0.1
    token_weight: float = 1.0
    tag_weight: float = 1.0
    token_class_weights: list[float] = field(default_factory=lambda: [1.0, 1.0])
    gradient_checkpointing: bool = False
    # encoder parameters (name prefixes, e.g. embeddings.word_embeddings) kept as the base encoder has them: a
    # shipped int8 copy then stores them by reference to the installed base (effrag.models.compact)
    freeze: list[str] = field(default_factory=list)
    # keep only the encoder's first N layers (a smaller student, e.g. of a trained ranker given as name_or_path)
    num_layers: int | None = None
    extra_options: dict = field(default_factory=dict)  # model-specific options of other tasks (e.g. IRRR)


@dataclass
class DataConfig:
    train_file: str = ""
    eval_files: list[str] = field(default_factory=list)
    max_train_examples: int | None = None  # a seeded random subset, for quick runs
    max_eval_examples: int | None = None  # per eval file
    sources: list[str] | None = None  # keep only records whose "source" is listed (e.g. [annotation])


@dataclass
class TrainConfig:
    output_dir: str = "runs/train/model"
    seed: int = 42
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; overrides epochs
    batch_size: int = 16  # per process; effective = batch_size * grad_accum * num_processes
    group_by_length: bool = False  # batches of similar length: much less padding
    eval_batch_size: int = 64
    grad_accum: int = 1
    lr: float = 5e-5
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    scheduler: str = "linear"  # any transformers.get_scheduler name: linear, cosine, constant_with_warmup, ...
    warmup_ratio: float = 0.06
    warmup_steps: int | None = None  # overrides warmup_ratio
    max_grad_norm: float = 1.0
    mixed_precision: str = "bf16"  # no | bf16 | fp16 (fp16 needs a GPU)
    eval_every: int = 0  # optimizer steps; 0 = at the end of each epoch only
    save_every: int = 0  # optimizer steps between resumable checkpoints; 0 = end of each epoch
    save_total_limit: int = 2
    metric_for_best: str | None = None  # default: the task's
    greater_is_better: bool = True
    log_every: int = 10
    report_to: str = "none"  # none | wandb (honours WANDB_MODE, e.g. offline)
    project: str = "effrag"
    run_name: str | None = None
    resume_from_checkpoint: str | None = None  # a checkpoint dir or "latest"
    num_workers: int = 0
    torch_threads: int | None = None  # per process; None keeps torch's default (accelerate sets OMP_NUM_THREADS)
    save_last: bool = True


@dataclass
class Config:
    task: str = "labeler"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)


def _read_yaml(path: Path, seen: tuple = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: circular 'base:' chain {' -> '.join(map(str, seen + (path,)))}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    return _merge(_read_yaml((path.parent / base).resolve(), seen + (path,)), raw)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_overrides(args: list[str]) -> dict:
    """``["--train.lr", "1e-5", "--task=filter"]`` -> nested dict of YAML-parsed values."""
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: overrides look like --section.key value")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(f"override {arg} has no value")
            value = args[i + 1]
            i += 1
        i += 1
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        parsed = yaml.safe_load(value) if value != "" else ""
        if isinstance(parsed, bool) and value.lower() not in ("true", "false"):
            parsed = value  # YAML 1.1 reads no/yes/on/off as booleans; keep the word (mixed_precision: no)
        node[parts[-1]] = parsed
    return out


def find_config(name_or_path: str | Path) -> Path:
    """A YAML file's path, or the name of a packaged default config (``labeler``: effrag/configs/labeler.yaml)."""
    from .. import configs

    given = Path(name_or_path)
    if given.is_file() or given.suffix or len(given.parts) > 1:
        return given.resolve()
    try:
        return configs.path(str(name_or_path)).resolve()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {given} (nor a packaged config name: "
                          f"{', '.join(configs.names())})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Config from a YAML file or packaged config name (optional) with overrides applied on top."""
    raw = _read_yaml(find_config(path)) if path else {}
    over = parse_overrides(overrides) if isinstance(overrides, list) else (overrides or {})
    where = str(path) if path else "config"
    cfg = _build(Config, _merge(raw, over), where)
    validate(cfg, where)
    return cfg


def validate(cfg: Config, where: str = "config") -> None:
    """Values that parse but cannot train: unknown task, non-positive sizes or lr, missing encoder, ..."""
    from .tasks import BUILTIN, TASKS

    known = sorted(set(BUILTIN) | set(TASKS))
    if cfg.task not in known:
        raise ConfigError(f"{where}: task: unknown {cfg.task!r}; known tasks: {known}")
    m, d, t = cfg.model, cfg.data, cfg.train
    checks = [
        ("model.max_length", m.max_length, m.max_length > 0, "> 0"),
        ("model.num_layers", m.num_layers, m.num_layers is None or m.num_layers > 0, "> 0 or null"),
        ("model.head_dropout", m.head_dropout, 0 <= m.head_dropout < 1, "in [0, 1)"),
        ("model.attention_dropout", m.attention_dropout, m.attention_dropout is None or 0 <= m.attention_dropout < 1, "in [0, 1)"),
        ("model.hidden_dropout", m.hidden_dropout, m.hidden_dropout is None or 0 <= m.hidden_dropout < 1, "in [0, 1)"),
        ("model.token_class_weights", m.token_class_weights,
         len(m.token_class_weights) == 2 and all(w > 0 for w in m.token_class_weights), "two positive weights"),
        ("data.max_train_examples", d.max_train_examples, d.max_train_examples is None or d.max_train_examples > 0, "> 0 or null"),
        ("data.max_eval_examples", d.max_eval_examples, d.max_eval_examples is None or d.max_eval_examples > 0, "> 0 or null"),
        ("train.batch_size", t.batch_size, t.batch_size > 0, "> 0"),
        ("train.eval_batch_size", t.eval_batch_size, t.eval_batch_size > 0, "> 0"),
        ("train.grad_accum", t.grad_accum, t.grad_accum > 0, "> 0"),
        ("train.lr", t.lr, t.lr > 0, "> 0"),
        ("train.epochs", t.epochs, t.epochs > 0 or (t.max_steps or 0) > 0, "> 0 (or train.max_steps > 0)"),
        ("train.max_steps", t.max_steps, t.max_steps is None or t.max_steps > 0, "> 0 or null"),
        ("train.weight_decay", t.weight_decay, t.weight_decay >= 0, ">= 0"),
        ("train.warmup_ratio", t.warmup_ratio, 0 <= t.warmup_ratio <= 1, "in [0, 1]"),
        ("train.warmup_steps", t.warmup_steps, t.warmup_steps is None or t.warmup_steps >= 0, ">= 0 or null"),
        ("train.max_grad_norm", t.max_grad_norm, t.max_grad_norm > 0, "> 0"),
        ("train.mixed_precision", t.mixed_precision, t.mixed_precision in ("no", "bf16", "fp16"), "no, bf16 or fp16"),
        ("train.eval_every", t.eval_every, t.eval_every >= 0, ">= 0"),
        ("train.save_every", t.save_every, t.save_every >= 0, ">= 0"),
        ("train.save_total_limit", t.save_total_limit, t.save_total_limit >= 1, ">= 1"),
        ("train.log_every", t.log_every, t.log_every >= 1, ">= 1"),
        ("train.num_workers", t.num_workers, t.num_workers >= 0, ">= 0"),
        ("train.torch_threads", t.torch_threads, t.torch_threads is None or t.torch_threads >= 1, ">= 1 or null"),
        ("train.report_to", t.report_to, t.report_to in ("none", "wandb"), "'none' or 'wandb'"),
    ]
    for key, value, ok, want in checks:
        if not ok:
            raise ConfigError(f"{where}: {key} must be {want}, got {value!r}")
    if t.scheduler not in _COMMON_SCHEDULERS and t.scheduler not in _scheduler_names():  # imports transformers
        raise ConfigError(f"{where}: train.scheduler must be one of {', '.join(_scheduler_names())}, got {t.scheduler!r}")


_COMMON_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial")


def _scheduler_names() -> list[str]:
    """The names ``transformers.get_scheduler`` knows (its ``SchedulerType``)."""
    try:
        from transformers.trainer_utils import SchedulerType
    except ImportError:  # pragma: no cover - transformers is a dependency
        return ["linear", "cosine", "constant", "constant_with_warmup"]
    return [s.value for s in SchedulerType]


def check_encoder(name: str, where: str = "config") -> None:
    """An alias, a local folder, or a hub id already in the local cache (nothing is downloaded).

    Checked when a model is built, not when a config is read: a config naming a GPU-only
    encoder (``configs/labeler_paper.yaml``) can still be loaded and inspected anywhere.
    """
    from ..models.heads import ENCODER_ALIASES

    if str(name).lower() in ENCODER_ALIASES or Path(name).is_dir():
        return
    cached = None
    if "/" in str(name) and not Path(name).is_absolute() and not str(name).startswith("."):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(name), "config.json")
        except Exception:  # noqa: BLE001 - an invalid repo id is simply "not cached"
            cached = None
    if not isinstance(cached, str):
        raise ConfigError(f"{where}: model.name_or_path: {name!r} is neither an encoder alias "
                          f"({', '.join(sorted(ENCODER_ALIASES))}), a local folder, nor a locally cached hub model")


def _build(cls, raw: dict, where: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = set(raw) - set(fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in raw.items():
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            kwargs[name] = _build(typ, value or {}, f"{where}: {name}")
        else:
            kwargs[name] = _coerce(value, typ, f"{where}: {name}")
    return cls(**kwargs)


def _coerce(value, typ, where: str):
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in {"null", "none"}):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if typ is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, args[0], where) for v in value]
    if value is None:
        raise ConfigError(f"{where}: may not be null")
    try:
        if typ is bool:
            if isinstance(value, str) and value.lower() in {"true", "false", "yes", "no", "1", "0"}:
                return value.lower() in {"true", "yes", "1"}
            if isinstance(value, bool):
                return value
            raise ValueError
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(float(value)) if isinstance(value, str) else int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            if isinstance(value, bool):  # `mixed_precision: no` in a YAML file arrives as False
                return "yes" if value else "no"
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: cannot read {value!r} as {typ.__name__}") from None
    return value


def save_config(cfg: Config, path: str | Path, extra: dict | None = None) -> None:
    data = cfg.to_dict()
    if extra:
        data = {**data, **extra}
    from ..state_files import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
