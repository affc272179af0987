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
from collections.abc import Callable
from typing import Any

from .result import Result

# Name -> module for methods whose home is known; new methods are also found by scanning.
KNOWN_MODULES = {
    "direct-r": "effrag.pipelines.direct_r",
    "direct": "effrag.pipelines.direct",
    "direct-llm": "effrag.pipelines.direct",
    "efficientrag": "effrag.pipelines.efficientrag.pipeline",
    "irrr": "effrag.pipelines.irrr",
    "ircot": "effrag.pipelines.ircot",
}

# The method every front end runs when the caller names none (``effrag eval``, ``effrag retrieve``, ``effrag serve``,
# a run config, a Haystack component built from paths): the shipped EfficientRAG system.
DEFAULT_METHOD = "efficientrag"
# The retriever a front end builds when neither the caller, its config nor a loop config file names one: the one the
# shipped system's loop configs were tuned over.
DEFAULT_RETRIEVER = "hybrid"

_REGISTRY: dict[str, type[Pipeline]] = {}
_ALIASES: dict[str, str] = {}
_IMPORT_ERRORS: dict[str, str] = {}


class Pipeline:
    """One retrieval (and optionally answering) method.

    ``run(question)`` returns a :class:`~.result.Result`: ranked chunks with scores and hops,
    the answer (when the method answers), LLM usage, iterations, the method's trace. The
    evaluation runner writes ``result.to_row()`` to ``predictions.jsonl`` (adding ``qid``, gold
    fields and ``latency_s``); the framework adapters and ``effrag serve`` read the same object.

    ``slice_k = True`` says the ranking for a smaller k is a prefix of the ranking for
    a larger one (single-shot retrieval), so one run at the largest k can be scored
    at every k.

    What ``__init__`` takes, declared so callers need not inspect signatures
    (:func:`llm_options` turns ``effrag eval --llm`` into keywords from these):
    ``uses_llm``: an LLM (``llm=``, an :class:`effrag.llm.LLM` or a spec string);
    ``uses_generator``: an answer ``generator=`` hook run over the retrieved chunks
    (see :func:`.generation.answer_results`); ``uses_dataset``: the questions' dataset
    (``dataset=``, e.g. to pick few-shot prompts); ``uses_reader``: an extractive reader
    checkpoint of its own (``reader=``, SearChain's verifier). :func:`reader_options` turns
    ``effrag eval --reader DIR`` into ``reader=`` or an LLM-free ``generator=``.

    ``call_options`` names the fields of the method's ``config`` a caller may change for one call (the
    adapters' options, ``effrag serve``'s per-request thresholds: ``config.replace(**options)``); empty for a
    method without them.

    ``uses_system``: the method loads a trained system, named by a folder or a shipped name
    (:meth:`system_options`, ``effrag retrieve --model``); ``k_in_config``: its retrieval depth comes from its
    own config unless a caller gives ``k`` (no default ``k`` is passed to it), the config field ``depth_option``. ``chunk_score_name``: what a
    chunk's ``score`` is when the method orders by another value (``Chunk.order_score``), for front ends that
    print both.
    """

    name = "pipeline"
    slice_k = False
    uses_llm = False
    uses_generator = False
    uses_dataset = False
    uses_reader = False
    uses_system = False
    k_in_config = False
    depth_option = "k"
    chunk_score_name = "score"
    call_options: frozenset[str] = frozenset()

    def run(self, question: str) -> Result:
        raise NotImplementedError

    def run_batch(self, questions: list[str]) -> list[Result]:
        return [self.run(q) for q in questions]

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add method-specific ``effrag eval`` options; their values reach ``__init__`` as keywords."""

    @classmethod
    def check_options(cls, **opts: Any) -> None:
        """Raise ValueError on bad method options before any corpus or index is built (default: checked in
        ``__init__`` only)."""

    @classmethod
    def check_file_options(cls, checkpoints: dict[str, Any], options: dict[str, Any], where: str,
                           prefix: str = "method.") -> None:
        """The checkpoints (``model``, ``labeler``, ...) and options a config file gives the method (``effrag
        serve``'s serve.yaml), checked at start-up: one error naming the file (``where``) and the key (under
        ``prefix``). Default: :meth:`check_options` on them."""
        try:
            cls.check_options(**{k: v for k, v in checkpoints.items() if v is not None}, **options)
        except ValueError as e:
            raise ValueError(f"{where}: {prefix}options: {e}") from None

    @classmethod
    def request_rules(cls) -> dict[str, Any]:
        """The options one request to ``effrag serve`` may set for this method, each with its rule (an object with
        ``type``, ``min``, ``max``, ``choices`` and ``optional``, as :class:`~.efficientrag.config.Rule`): the
        service's request schema. A subset of :attr:`call_options`; default none."""
        return {}

    @classmethod
    def system_options(cls, model: str | None = None, config_file: str | None = None) -> dict[str, Any]:
        """Keywords for ``cls(...)`` that load the trained system ``model`` (a folder or a shipped name; None: the
        method's default system), with ``config_file`` in place of the system's own settings. Only for a method
        that ``uses_system``."""
        raise ValueError(f"method {cls.name!r} loads no trained system")

    @classmethod
    def plan(cls, options: dict[str, Any] | None = None, *, dataset: str | None = None, k: int | None = None,
             default_k: int | None = None):
        """The method resolved once for ``dataset``'s questions (:class:`.plan.Plan`): ``options`` checked before
        any corpus or index is built, the retriever and encoder its settings were tuned over (default: none), and
        the depth to pass (``k``, else ``default_k`` unless ``k_in_config``). Every front door plans, sets up the
        retriever, then builds (:meth:`.plan.Plan.build`)."""
        from .plan import Plan, depth

        opts = dict(options or {})
        cls.check_options(**opts)
        return Plan(cls, opts, dataset, k=depth(cls, k, default_k))


def dataset_option(cls: type[Pipeline], dataset: str | None) -> dict[str, Any]:
    """``{"dataset": dataset}`` for a method that uses the questions' dataset (few-shot prompts, a system's
    per-dataset loop config), else nothing."""
    return {"dataset": dataset} if cls.uses_dataset else {}


def llm_options(cls: type[Pipeline], llm: str | None, dataset: str | None) -> dict[str, Any]:
    """Keywords for ``cls(...)`` from an LLM spec (``effrag eval --llm``) and the questions' dataset.

    A method that uses an LLM gets the spec; a retrieve-then-read method gets the shared answer
    :class:`~.generation.Generator` with the paper's retrieval-QA prompt for ``dataset``; a method
    that uses the dataset gets it. Raises ValueError when an LLM is given to a method that has no use for one.
    """
    opts: dict[str, Any] = dataset_option(cls, dataset)
    if llm is None:
        return opts
    if cls.uses_llm:
        opts["llm"] = llm
    elif cls.uses_generator:
        from .generation import Generator

        opts["generator"] = Generator(llm, dataset=dataset)
    else:
        raise ValueError(f"method {cls.name!r} does not use an LLM (--llm)")
    return opts


def reader_options(cls: type[Pipeline], reader: Any, together: bool = True, context: str = "chunks") -> dict[str, Any]:
    """Keywords for ``cls(...)`` from a trained extractive reader (``effrag eval --reader DIR``).

    A method with a reader of its own gets it as ``reader=``; a retrieve-then-read method answers
    its pool with it (a :class:`~.generation.ReaderGenerator`, no LLM call). Raises ValueError for
    a method that answers with its LLM.
    """
    if reader is None:
        return {}
    if cls.uses_reader:
        return {"reader": reader}
    if cls.uses_generator:
        from .generation import ReaderGenerator

        return {"generator": ReaderGenerator(reader, together=together, context=context)}
    readers = [n for n in available_pipelines() if _REGISTRY[n].uses_generator or _REGISTRY[n].uses_reader]
    raise ValueError(f"method {cls.name!r} answers with its LLM; --reader applies to {', '.join(readers)}")


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
    for module in sorted(set(KNOWN_MODULES.values())):  # a method in a sub-package (efficientrag.pipeline)
        _try_import(module)


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
