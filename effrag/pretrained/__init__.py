"""Trained models shipped inside the package, loadable offline by name.

``efficientrag-all`` is the recommended EfficientRAG model (Labeler, Filter, and the loop config tuned
on each dataset's dev file), exported from ``bash scripts/train_efficientrag.sh all`` by
``scripts/export_pretrained.py`` with its encoders stored as int8 rows (:mod:`effrag.models.compact`).
Its model card is ``README.md`` in its directory.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
NAMES = ("efficientrag-all",)
LOOP_DATASETS = ("hotpotqa", "2wikimqa", "musique")


def pretrained_path(name: str = "efficientrag-all") -> Path:
    """The directory of a shipped model (``labeler/``, ``filter/``, ``loop-<dataset>.json``)."""
    if name not in NAMES:
        raise ValueError(f"unknown shipped model {name!r}; shipped: {', '.join(NAMES)}")
    path = _HERE / name
    if not (path / "labeler").is_dir() or not (path / "filter").is_dir():
        raise FileNotFoundError(f"{path} is incomplete (no labeler/ or filter/): reinstall effrag, or re-export it "
                                f"with python scripts/export_pretrained.py")
    return path


def loop_config_path(dataset: str, name: str = "efficientrag-all") -> Path:
    """The shipped loop config tuned on ``dataset``'s dev file."""
    if dataset not in LOOP_DATASETS:
        raise ValueError(f"no loop config for dataset {dataset!r}; tuned for: {', '.join(LOOP_DATASETS)}")
    return pretrained_path(name) / f"loop-{dataset}.json"
