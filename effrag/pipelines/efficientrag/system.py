"""A trained EfficientRAG system opened from one path: its models, its loop config and the retriever it was tuned for.

A system folder (what ``bash scripts/train_efficientrag.sh all`` writes, and what ``effrag/pretrained/`` ships)::

    labeler/  filter/  [ranker/]     checkpoints
    [set-ranker/]                    the set-wise pool ranker a config with set_ranker_top reads
    [ranker-<name>/]                 other pool rankers a loop config may read with (ranker-teacher/, ranker-late/)
    loop.json                        the general loop config, tuned jointly over the dev files
    loop-<dataset>.json              optional per-dataset configs

Every loop config file records the retriever it was tuned for (``"retriever": "hybrid"``), because its
options were chosen over that retriever's candidates, and the system's ranker folder it was tuned with when that is
not ``ranker/`` (``"ranker": "ranker-teacher"``: the cheapest reading that keeps a dataset's bar may need the larger
ranker). :func:`open_system` resolves a folder or a shipped
name (``efficientrag-all``) into paths; ``effrag eval --method efficientrag``, ``EfficientRAG.from_pretrained``
and ``effrag serve`` all go through it, so they pick the same files and the same retriever.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENERAL_CONFIG = "loop.json"
DEFAULT_SYSTEM = "efficientrag-all"
SET_RANKER = "set-ranker"  # the set-wise pool ranker's folder in a system (effrag.models.set_ranker)


@dataclass(frozen=True)
class SystemFiles:
    """The files of one system: checkpoints, the loop config chosen, and the retriever that config names."""

    root: Path
    labeler: Path
    filter: Path
    ranker: Path | None
    config: Path | None
    retriever: str | None
    encoder: str | None = None  # the dense leg's encoder alias the config was tuned over (None: the default)
    set_ranker: Path | None = None  # set-ranker/: what a config with set_ranker_top reorders its pool with

    def describe(self) -> dict[str, Any]:
        return {"labeler": str(self.labeler), "filter": str(self.filter),
                "ranker": str(self.ranker) if self.ranker else None,
                "config": str(self.config) if self.config else None, "retriever": self.retriever,
                "encoder": self.encoder}


def system_root(model: str | Path) -> Path:
    """A system folder, or the folder of a shipped system named ``model``."""
    from effrag.pretrained import NAMES, SHIPPABLE, pretrained_path

    systems = [n for n in NAMES if SHIPPABLE[n].what == "EfficientRAG system"]
    if str(model) in systems:
        return pretrained_path(str(model))
    root = Path(model)
    if not (root / "labeler").is_dir() or not (root / "filter").is_dir():
        raise FileNotFoundError(f"{root}: not an EfficientRAG system folder (needs labeler/ and filter/; shipped "
                                f"systems: {', '.join(systems)})")
    return root


def dataset_config(path: str | Path | None, dataset: str) -> str | None:
    """A loop config given as a file (itself), or as a folder holding ``loop-<dataset>.json`` per dataset (a
    system's): that file; None for None. FileNotFoundError when the path or the dataset's file is not there."""
    if path is None:
        return None
    path = Path(path)
    if path.is_file():
        return str(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    f = path / f"loop-{dataset}.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path} has no loop-{dataset}.json for {dataset}")
    return str(f)


def _read_config(config: str | Path | dict) -> tuple[Any, Any]:
    """A loop config file's parsed JSON (or the dict given) and what to name it in an error."""
    if isinstance(config, dict):
        return config, "the loop config"
    path = Path(config)
    try:
        return json.loads(path.read_text()), path
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read EfficientRAG config {path}: {e}") from None


def config_retriever(config: str | Path | dict | None) -> str | None:
    """The retriever a loop config file (or its parsed JSON) was tuned for, if it records one."""
    if config is None:
        return None
    config, where = _read_config(config)
    if not isinstance(config, dict):
        return None
    kind = config.get("retriever") or (config.get("setup") or {}).get("retriever")
    if not kind:
        return None
    from effrag.retrieval.index import KINDS

    if kind not in KINDS:  # a typo here used to fall back silently to whatever index was given
        raise ValueError(f"{where}: field 'retriever': unknown retriever {kind!r}; expected one of {', '.join(KINDS)}")
    return str(kind)


def config_encoder(config: str | Path | dict | None) -> str | None:
    """The encoder alias (``minilm``, ``e5-small``) a loop config file was tuned over: its top-level ``"encoder"``,
    which every front end building the config's dense or hybrid retriever uses unless told another. None when the
    config names none (configs written before the field: tuned over the default, MiniLM)."""
    if config is None:
        return None
    config, where = _read_config(config)
    name = config.get("encoder") if isinstance(config, dict) else None
    if name is None:
        return None
    from effrag.models.encoders import CANONICAL_ALIASES

    if name not in CANONICAL_ALIASES:  # a path would tie a shipped config to one machine; a typo must not fall back
        raise ValueError(f"{where}: field 'encoder': {name!r} is not a packaged encoder alias; expected one of "
                         f"{', '.join(CANONICAL_ALIASES)}")
    return str(name)


def config_ranker(config: str | Path | None) -> str | None:
    """The system's ranker folder a loop config file was tuned with (its top-level ``"ranker"``), if it names one."""
    if config is None:
        return None
    data, _ = _read_config(config)
    name = data.get("ranker") if isinstance(data, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or not name.startswith("ranker") or Path(name).name != name:
        raise ValueError(f"{config}: field 'ranker': {name!r} is not a ranker folder name of the system "
                         "(ranker or ranker-<name>)")
    return name


def open_system(model: str | Path = DEFAULT_SYSTEM, config: str | Path | None = None,
                dataset: str | None = None) -> SystemFiles:
    """The files of system ``model``: ``config`` if given, else ``loop-<dataset>.json`` when ``dataset`` is given
    and the system has one, else the general ``loop.json`` (if the system has it)."""
    root = system_root(model)
    chosen = Path(config) if config is not None else None
    if chosen is None and dataset and (root / f"loop-{dataset}.json").is_file():
        chosen = root / f"loop-{dataset}.json"
    if chosen is None and (root / GENERAL_CONFIG).is_file():
        chosen = root / GENERAL_CONFIG
    if chosen is None:
        import logging

        logging.getLogger(__name__).warning(
            "%s has no %s%s: the loop runs on the library's default options, which no dev file chose (give "
            "--er-config FILE, or train the system with scripts/train_efficientrag.sh)", root, GENERAL_CONFIG,
            f" nor loop-{dataset}.json" if dataset else "")
    named = config_ranker(chosen)
    if named is not None and not (root / named).is_dir():
        raise FileNotFoundError(f"{chosen}: field 'ranker' names {named}/, which {root} does not hold")
    ranker = root / (named or "ranker") if (root / (named or "ranker")).is_dir() else None
    set_ranker = root / SET_RANKER if (root / SET_RANKER).is_dir() else None
    for member in (root / "labeler", root / "filter", ranker, set_ranker):
        if member is not None:
            inside_system(root, member)
    return SystemFiles(root=root, labeler=root / "labeler", filter=root / "filter", ranker=ranker, config=chosen,
                       retriever=config_retriever(chosen), encoder=config_encoder(chosen), set_ranker=set_ranker)


def inside_system(root: Path, member: Path) -> None:
    """Refuse a model folder of the system (or a file in it) that is a symbolic link resolving outside ``root``.

    Who copies, checks or ships a system folder reads its files as the system's: a ``ranker-<name>`` link to weights
    elsewhere made the loop read models nobody could see from the folder (and that its records did not cover). A
    link that stays inside the system (``ranker`` -> ``ranker-teacher``) and a system folder that is itself a link
    are fine."""
    top = root.resolve()
    for path in (member, *sorted(member.iterdir())):
        if path.is_symlink() and not path.resolve().is_relative_to(top):
            raise ValueError(f"{path}: a symbolic link to {path.resolve()}, outside the system folder {root}; a "
                             "system's models must be inside it (copy them in instead of linking them)")
