"""The default configs, shipped inside the package so that an installed effrag has them too.

Training (``labeler``, ``filter``, ``irrr``, ``reader`` and the ``*_paper`` GPU settings), serving
(``serve``), an example eval run (``eval``: ``effrag eval --config eval``, :mod:`effrag.run_config`) and launcher
files (``accelerate/deepspeed_zero2.yaml``, ``deepspeed/zero2.json``). In a source checkout the top-level
``configs/`` is a link to this folder, so ``configs/labeler.yaml`` and
``accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml`` keep working from the repo root.

    effrag.configs.path("labeler")    # .../effrag/configs/labeler.yaml
    train.py --config labeler         # the same file, by name (effrag.training.load_config)
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def names() -> list[str]:
    """Names of the packaged YAML configs at the top level (``labeler``, ``serve``, ...)."""
    return sorted(f.name[: -len(".yaml")] for f in resources.files(__name__).iterdir() if f.name.endswith(".yaml"))


def path(name: str) -> Path:
    """The packaged file of config ``name``: ``labeler`` is ``labeler.yaml``; a name with a suffix
    (``deepspeed/zero2.json``) is taken as is."""
    relative = name if Path(name).suffix else f"{name}.yaml"
    found = resources.files(__name__).joinpath(relative)
    if not found.is_file():
        raise FileNotFoundError(f"no packaged config {name!r}; packaged: {', '.join(names())}")
    return Path(str(found))
