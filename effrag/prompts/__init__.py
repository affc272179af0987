"""Prompts as data files (README.md in this folder gives each file's source), and the one way to fill them.

:func:`load_prompt` reads ``<name>.txt`` (one prompt, returned as text) or ``<name>.yaml`` (a
:class:`PromptSet`: the templates and few-shot examples of one method). :func:`fill` puts values
into any template: ``{name}`` is a field and ``{name_json}`` its JSON encoding; filling is one pass,
so braces inside values are never read as fields.

Two kinds of template, one filler (``strict``):

* ``strict=True`` (the YAML templates, written for the filler): ``str.format`` rules. ``{{`` and
  ``}}`` are literal braces, a field without a value is an error naming it, a lone brace is an error.
* ``strict=False`` (prompts copied verbatim from papers, e.g. ``qa/*.txt``, and users' own QA
  templates): only the fields given are filled; every other brace text (``{"answer": ...}``,
  ``{KNOWLEDGE FOR YOUR REFERENCE}``, ``{{``) is left as written.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PROMPT_DIR = Path(__file__).resolve().parent

_FIELD = re.compile(r"\{\{|\}\}|\{(\w+)\}|[{}]")


def fill(template: str, where: str = "template", /, *, strict: bool = True, **values: Any) -> str:
    """``template`` with its ``{field}`` / ``{field_json}`` holes filled from ``values`` (see the module doc).

    ``where`` names the template in error messages (e.g. the prompt file and key).
    """

    def sub(m: re.Match) -> str:
        token, key = m.group(0), m.group(1)
        if key is None:  # "{{", "}}" or a lone brace
            if not strict:
                return token
            if len(token) == 2:
                return token[0]
            raise ValueError(f"{where}: single {token!r} at character {m.start()}; write {token * 2!r} "
                             f"for a literal brace")
        if key in values:
            return str(values[key])
        if key.endswith("_json") and key[:-5] in values:
            return json.dumps(values[key[:-5]], ensure_ascii=False)
        if strict:
            raise KeyError(f"{where}: template needs field {key!r}, have {sorted(values)}")
        return token

    return _FIELD.sub(sub, template)


@dataclass
class PromptSet:
    """One ``<name>.yaml`` file: templates (a string, or a mapping of variants such as datasets or
    modes with an optional ``default``) and few-shot examples per dataset, with a ``fallback``
    dataset for the others."""

    name: str
    data: dict[str, Any]
    path: Path

    def dataset_key(self, dataset: str | None, section: str = "examples") -> str:
        sets = self.data.get(section) or {}
        if dataset in sets:
            return dataset
        fallback = self.data.get("fallback")
        if fallback not in sets:
            raise ValueError(f"{self.path}: no {section} for dataset {dataset!r} and fallback {fallback!r} "
                             f"is not one of {sorted(sets)}")
        return fallback

    def examples(self, dataset: str | None, section: str = "examples") -> list[dict[str, Any]]:
        """The few-shot examples for ``dataset`` (a copy), or the fallback set."""
        return [dict(e) for e in self.data[section][self.dataset_key(dataset, section)]]

    def text(self, key: str, variant: str | None = None) -> str:
        """A template; a mapping-valued key is looked up by ``variant`` (dataset or mode), else ``default``."""
        if key not in self.data:
            raise KeyError(f"{self.path}: no field {key!r}")
        val = self.data[key]
        if isinstance(val, dict):
            if variant in val:
                return val[variant]
            if "default" in val:
                return val["default"]
            raise KeyError(f"{self.path}: field {key!r} has no entry for {variant!r} and no 'default'")
        return val

    def fill(self, key: str, variant: str | None = None, /, **values: Any) -> str:
        """The template ``key`` (``variant``) filled strictly with ``values``."""
        return fill(self.text(key, variant), f"{self.path}:{key}", **values)

    def render_examples(self, dataset: str | None, n: int | None = None, template_key: str = "example",
                        section: str = "examples", variant: str | None = None, sep: str = "\n\n") -> str:
        """The first ``n`` (default: all) examples for ``dataset``, each filled into ``template_key``."""
        exs = self.examples(dataset, section)[: n if n is not None else None]
        return sep.join(self.fill(template_key, variant, **e) for e in exs)


@cache
def load_prompt(name: str) -> str | PromptSet:
    """The prompt file ``<name>.txt`` (its text) or ``<name>.yaml`` (a :class:`PromptSet`) under this folder,
    e.g. ``load_prompt("qa/hotpotqa")``, ``load_prompt("methods/cot")``."""
    txt, yml = PROMPT_DIR / f"{name}.txt", PROMPT_DIR / f"{name}.yaml"
    if txt.is_file():
        return txt.read_text(encoding="utf-8").strip()
    if yml.is_file():
        import yaml

        with yml.open(encoding="utf-8") as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{yml}: expected a mapping at the top level")
        return PromptSet(name, data, yml)
    have = sorted(str(p.relative_to(PROMPT_DIR).with_suffix("")) for ext in ("*.txt", "*.yaml")
                  for p in PROMPT_DIR.rglob(ext))
    raise FileNotFoundError(f"no prompt {name!r} in {PROMPT_DIR}; available: {', '.join(have)}")
