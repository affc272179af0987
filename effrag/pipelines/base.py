"""The Pipeline base class and the method registry behind ``effrag eval --method``.

A method is a :class:`Pipeline` subclass registered with
``@register_pipeline("name")`` in its own module under ``effrag/pipelines/``.
The registry finds it by name without importing every method up front: known
names map to their module, and an unknown name triggers a scan of the package's
modules (a module that fails to import, e.g. for a missing optional package, is
skipped with its error kept for the message).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any, Callable

# Name -> module for methods whose home is known; new methods are also found by scanning.
KNOWN_MODULES = {
    "direct-r": "effrag.pipelines.direct_r",
    "direct": "effrag.pipelines.direct",
    "direct-llm": "effrag.pipelines.direct",
    "efficientrag": "effrag.pipelines.efficientrag",
    "irrr": "effrag.pipelines.irrr",
    "ircot": "effrag.pipelines.ircot",
}

_REGISTRY: dict[str, type["Pipeline"]] = {}
_ALIASES: dict[str, str] = {}
_IMPORT_ERRORS: dict[str, str] = {}


class Pipeline:
    """One retrieval (and optionally answering) method.

    ``run(question)`` returns a dict with the MethodOutput fields of docs/design.md:
    ``retrieved`` (passage ids, best/first first), ``scores``, optional ``answer``,
    ``llm_calls``, ``prompt_tokens``, ``completion_tokens``, ``iterations``, optional
    ``trace``. The evaluation runner adds ``qid``, gold fields and ``latency_s``.

    ``slice_k = True`` says the ranking for a smaller k is a prefix of the ranking for
    a larger one (single-shot retrieval), so one run at the largest k can be scored
    at every k.
    """

    name = "pipeline"
    slice_k = False

    def run(self, question: str) -> dict[str, Any]:
        raise NotImplementedError

    def run_batch(self, questions: list[str]) -> list[dict[str, Any]]:
        return [self.run(q) for q in questions]

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add method-specific ``effrag eval`` options; their values reach ``__init__`` as keywords."""

    @staticmethod
    def output(retrieved: list[str], scores: list[float], answer: str | None = None, *, llm_calls: int = 0,
               prompt_tokens: int = 0, completion_tokens: int = 0, iterations: int = 1,
               trace: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {"retrieved": list(retrieved), "scores": [float(s) for s in scores],
                               "llm_calls": llm_calls, "prompt_tokens": prompt_tokens,
                               "completion_tokens": completion_tokens, "iterations": iterations}
        if answer is not None:
            out["answer"] = answer
        if trace is not None:
            out["trace"] = trace
        return out


def register_pipeline(name: str, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator: make a Pipeline available as ``effrag eval --method name``."""

    def deco(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        for a in aliases:
            _ALIASES[a] = name
        return cls

    return deco


def _try_import(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        if e.name != module:  # the module exists but needs something missing
            _IMPORT_ERRORS[module] = str(e)


def _scan() -> None:
    from pathlib import Path

    package = __name__.rsplit(".", 1)[0]  # the pipelines package: its folder is this file's
    for info in pkgutil.iter_modules([str(Path(__file__).parent)], package + "."):
        if info.name != __name__:
            _try_import(info.name)


def _lookup(name: str) -> type[Pipeline] | None:
    return _REGISTRY.get(_ALIASES.get(name, name))


def get_pipeline_class(name: str) -> type[Pipeline]:
    """The class registered as ``name`` (or an alias). Raises ValueError naming the choices."""
    cls = _lookup(name)
    if cls is None and name in KNOWN_MODULES:
        _try_import(KNOWN_MODULES[name])
        cls = _lookup(name)
    if cls is None:
        _scan()
        cls = _lookup(name)
    if cls is None:
        hint = "".join(f"; {m} failed to import: {err}" for m, err in _IMPORT_ERRORS.items())
        raise ValueError(f"unknown method {name!r}; available: {', '.join(available_pipelines())}{hint}")
    return cls


def available_pipelines() -> list[str]:
    """Names of every method that imports here (imports all pipeline modules)."""
    _scan()
    return sorted(_REGISTRY)


def build_pipeline(name: str, retriever, **opts) -> Pipeline:
    """An instance of the method ``name`` over ``retriever``; ``opts`` go to its ``__init__``."""
    return get_pipeline_class(name)(retriever, **opts)
