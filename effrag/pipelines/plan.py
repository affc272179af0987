"""A method resolved once, before anything loads: what every front door asks of it (issue #72, goal 3).

``effrag eval``, ``effrag retrieve``, ``effrag serve`` and ``EfficientRAG.from_pretrained`` each do three steps:
plan the method (:meth:`effrag.pipelines.base.Pipeline.plan`), set up the retriever it asks for, build it
(:meth:`Plan.build`). The plan holds what a door used to ask the method for one question at a time (its options
checked, the settings file chosen, the retriever and encoder those settings were tuned over, the depth to pass),
so the method's own system folder is read once. Anchor: ColBERT's ``Searcher`` with ``base_config.from_existing``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Plan:
    """``cls`` with ``options`` (its keywords, checked), for ``dataset``'s questions.

    ``retriever`` / ``encoder``: the retriever kind and the dense encoder alias the method's settings were tuned
    over (None: the method names none; a door builds them when its caller names none). ``k``: the depth to pass
    ``cls(...)``, None where the method keeps its own (``k_in_config``) and the caller gave none. ``settings``: the
    settings file the method runs (EfficientRAG's ``loop-<dataset>.json``), for the door to say which."""

    cls: type  # a Pipeline subclass (not imported here: base.py imports this module)
    options: dict[str, Any] = field(default_factory=dict)
    dataset: str | None = None
    retriever: str | None = None
    encoder: str | None = None
    k: int | None = None
    settings: str | None = None

    @property
    def method(self) -> str:
        return self.cls.name

    def warnings(self, kind: str | None, retriever: Any = None, index: str | None = None) -> list[str]:
        """One line per way the retriever a door set up differs from the one the settings were tuned over: its kind
        (``kind``; Milvus holds dense vectors) and its dense encoder."""
        from effrag.setup import encoder_mismatch

        out = []
        if self.retriever and kind and {self.retriever, kind} != {"dense", "milvus"} and self.retriever != kind:
            out.append(f"the {self.method} loop config was tuned over a {self.retriever} retriever; this run uses "
                       f"{kind}{f' (index {index})' if index else ''}, whose candidates it was not tuned on")
        if retriever is not None and (mismatch := encoder_mismatch(self.encoder, retriever, self.method)):
            out.append(mismatch)
        return out

    def build(self, retriever: Any, **extra: Any) -> Any:
        """The method over ``retriever`` with the planned options and depth; ``extra``: what the door adds (an LLM,
        an answer step), never an option the caller already set."""
        opts = {**({"k": self.k} if self.k is not None else {}), **self.options}
        return self.cls(retriever, **opts, **{key: v for key, v in extra.items() if key not in opts})


def depth(cls: type, k: int | None, default_k: int | None) -> int | None:
    """The depth a door passes: the caller's ``k``; else ``default_k``, unless the method keeps its own depth."""
    if k is not None:
        return k
    return None if cls.k_in_config else default_k
