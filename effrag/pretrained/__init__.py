"""Trained models shipped inside the package, loadable offline by name.

Every command that takes a model folder also takes a shipped name: ``effrag eval --method efficientrag
--model efficientrag-all``, ``--reader reader-all`` (and SearChain's verifier, whose default it is),
``--method irrr --irrr-model irrr-all`` (the default). :func:`resolve_model` is that one rule.

``efficientrag-all`` is the recommended EfficientRAG system (Labeler, Filter, and the loop config tuned
on each dataset's dev file), exported from ``bash scripts/train_efficientrag.sh all`` by
``scripts/export_pretrained.py`` with its encoders stored as int8 rows (:mod:`effrag.models.compact`).
``reader-all`` (the extractive reader) and ``irrr-all`` (IRRR, with the loop options chosen for it in ``irrr.json``)
are shipped the same way; a known name whose folder is missing from an install is a one-line error that gives the
command training it.
Each shipped model's card is ``README.md`` in its directory.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from effrag.data.loaders import MULTIHOP_DATASETS

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Shippable:
    """A model effrag can ship: the checkpoint folders it must hold (``"."``: the folder itself is one), and the
    commands that make and export it."""

    what: str
    needs: tuple[str, ...]
    train: str
    export: str


# Every name effrag knows; NAMES are those whose folder is in this install.
SHIPPABLE = {
    "efficientrag-all": Shippable(
        "EfficientRAG system", ("labeler", "filter"), "bash scripts/train_efficientrag.sh all",
        "python scripts/export_pretrained.py --src checkpoints/efficientrag-all --dst effrag/pretrained/efficientrag-all"),
    "reader-all": Shippable(
        "extractive reader", (".",),
        "python scripts/train_models.py --models reader --name all --processes 2",
        "python scripts/export_pretrained.py --kind reader --src checkpoints/reader-all --dst effrag/pretrained/reader-all"),
    "irrr-all": Shippable(
        "IRRR model", (".",), "python scripts/train_models.py --models irrr --name all --processes 2",
        "python scripts/export_pretrained.py --kind irrr --src checkpoints/irrr-all --dst effrag/pretrained/irrr-all"),
}
NAMES = tuple(name for name in SHIPPABLE if (_HERE / name).is_dir())
LOOP_DATASETS = MULTIHOP_DATASETS
LOOP_FILES = ("loop.json", *(f"loop-{d}.json" for d in LOOP_DATASETS))  # a system's loop configs


class NotShippedError(FileNotFoundError):
    """A known shipped name whose folder is not in this install (not exported yet, or removed)."""


def pretrained_path(name: str = "efficientrag-all") -> Path:
    """The directory of the shipped model ``name`` (``efficientrag-all``: ``labeler/``, ``filter/``,
    ``loop-<dataset>.json``; ``reader-all``, ``irrr-all``: one checkpoint folder)."""
    spec = SHIPPABLE.get(name)
    if spec is None:
        raise ValueError(f"unknown shipped model {name!r}; shipped: {', '.join(NAMES) or 'none'}")
    path = _HERE / name
    local = f"checkpoints/{name}"
    if not path.is_dir():
        raise NotShippedError(f"{name} ({spec.what}) is not shipped with this effrag yet: train it with `{spec.train}` "
                              f"and pass {local}, or export it into the package with `{spec.export}`")
    from effrag.models.model_files import CONFIG_NAME, is_checkpoint

    missing = [f"{n}/{CONFIG_NAME}".lstrip("./") for n in spec.needs if not is_checkpoint(path / n)]
    if missing:
        raise FileNotFoundError(f"{path} is incomplete (no {', '.join(missing)}): reinstall effrag, or re-export it "
                                f"with `{spec.export}`")
    return path


def resolve_model(model: str | Path) -> Path:
    """A model folder from a shipped name (``reader-all``) or a path; a name wins over a folder of that name
    in the working directory (write ``./reader-all`` for that folder)."""
    if isinstance(model, str) and model in SHIPPABLE:
        return pretrained_path(model)
    return Path(model)


def loop_config_path(dataset: str, name: str = "efficientrag-all") -> Path:
    """The shipped loop config tuned on ``dataset``'s dev file."""
    if dataset not in LOOP_DATASETS:
        raise ValueError(f"no loop config for dataset {dataset!r}; tuned for: {', '.join(LOOP_DATASETS)}")
    return pretrained_path(name) / f"loop-{dataset}.json"
