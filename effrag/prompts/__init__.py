"""Prompt templates shipped as data files (see README.md in this folder for their sources)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load_prompt(name: str) -> str:
    """The text of ``<name>.txt`` under this folder, e.g. ``load_prompt("efficientrag/token_labeling")``."""
    path = PROMPT_DIR / f"{name}.txt"
    if not path.is_file():
        have = sorted(str(p.relative_to(PROMPT_DIR).with_suffix("")) for p in PROMPT_DIR.rglob("*.txt"))
        raise FileNotFoundError(f"no prompt {name!r} in {PROMPT_DIR}; available: {', '.join(have)}")
    return path.read_text(encoding="utf-8").strip()
