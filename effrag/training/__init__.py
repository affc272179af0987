"""Training: config, data, task registry and the one accelerate loop behind ``train.py``."""
from __future__ import annotations

from .config import Config, ConfigError, load_config, parse_overrides
from .loop import evaluate_only, train
from .tasks import TASKS, Task, get_task, register_task

__all__ = ["Config", "ConfigError", "load_config", "parse_overrides", "train", "evaluate_only",
           "Task", "TASKS", "get_task", "register_task"]
