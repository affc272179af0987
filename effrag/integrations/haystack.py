"""effrag as a Haystack retriever component (``pip install 'effrag[haystack]'``).

    from haystack import Pipeline
    from effrag.integrations.haystack import EffragHaystackRetriever
    p = Pipeline()
    p.add_component("retriever", EffragHaystackRetriever(rag, top_k=8))
    p.add_component("prompt", PromptBuilder(template=...))
    p.connect("retriever.documents", "prompt.documents")

A pipeline holding the component saves and loads (``Pipeline.dumps()`` / ``loads()``, YAML) when the
component is built from paths, which is what its ``to_dict`` records::

    EffragHaystackRetriever.from_paths(index="index/", labeler="ck/labeler", filter="ck/filter",
                                       loop_config="ck/loop-hotpotqa.json")      # EfficientRAG
    EffragHaystackRetriever.from_paths(index="index/", top_k=10)                  # Direct-R
    text = pipeline.dumps()
    Pipeline.loads(text, allowed_modules=["effrag.integrations.haystack"])       # Haystack's trust allowlist

``run(query, top_k=None)`` returns ``{"documents": [...], "trace": ...}``: Haystack
Documents with the passage id as ``id``, the retrieval score as ``score`` and meta
``id``, ``title``, ``score``, ``hop``, ``kept_words``, ``rank``, ``query``; ``trace``
is the method's per-hop record (EfficientRAG: queries, tags, kept words).
"""
from __future__ import annotations

import asyncio
from typing import Any

try:
    from haystack import Document, component, default_to_dict
    from haystack.core.errors import SerializationError
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"the Haystack adapter needs haystack-ai: pip install 'effrag[haystack]' ({e})") from e

from effrag.pipelines.result import Result

from . import _check_mode, as_source, chunk_content, chunk_metadata

__all__ = ["EffragHaystackRetriever", "to_haystack_documents"]


def to_haystack_documents(result: Result, content: str = "text") -> list[Document]:
    return [Document(id=c.id, content=chunk_content(c, content), meta=chunk_metadata(c, rank), score=c.score)
            for rank, c in enumerate(result.chunks)]


@component
class EffragHaystackRetriever:
    """A Haystack component over any effrag source (see :class:`effrag.integrations.ChunkSource`)."""

    def __init__(self, source: Any, top_k: int | None = None, content: str = "text",
                 options: dict[str, Any] | None = None, k: int = 10):
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.source = as_source(source, k=k)
        self.top_k, self.content, self.options = top_k, _check_mode(content), dict(options or {})
        self._paths: dict[str, Any] | None = None  # set by from_paths: what to_dict saves

    @classmethod
    def from_paths(cls, index: str, labeler: str | None = None, filter: str | None = None,  # noqa: A002
                   loop_config: str | None = None, top_k: int | None = None, content: str = "text",
                   options: dict[str, Any] | None = None, k: int = 10, *, model: str | None = None,
                   method: str | None = None) -> EffragHaystackRetriever:
        """A component over a saved index (``effrag index build``) and, by name, a registered method over it
        (``method``; its checkpoints: ``model``, a system folder or shipped name, or ``labeler``/``filter`` and a
        ``loop_config`` file; given without ``method``, they go to ``effrag.pipelines.DEFAULT_METHOD``). Without
        them: plain retrieval."""
        from effrag.pipelines import DEFAULT_METHOD, build_pipeline
        from effrag.setup import RunSetup

        retriever = RunSetup.build(index=index, retriever=None).retriever
        paths = {"model": model, "labeler": labeler, "filter": filter, "er_config": loop_config}
        method_options = {key: str(v) for key, v in paths.items() if v is not None}
        method = method or (DEFAULT_METHOD if method_options else None)
        source: Any = build_pipeline(method, retriever, **method_options) if method else retriever
        obj = cls(source, top_k=top_k, content=content, options=options, k=k)
        obj._paths = {"index": str(index), "labeler": labeler and str(labeler), "filter": filter and str(filter),
                      "loop_config": loop_config and str(loop_config), "top_k": top_k, "content": content,
                      "options": dict(options or {}), "k": k, "model": model and str(model), "method": method}
        return obj

    def to_dict(self) -> dict[str, Any]:
        if self._paths is None:
            raise SerializationError(
                "EffragHaystackRetriever built from Python objects cannot be saved; build it with "
                "EffragHaystackRetriever.from_paths(index=..., labeler=..., filter=..., loop_config=...)")
        return default_to_dict(self, **self._paths)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EffragHaystackRetriever:
        return cls.from_paths(**data.get("init_parameters", {}))

    @component.output_types(documents=list[Document], trace=Any)
    def run(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        result = self.source.retrieve(query, top_k=top_k or self.top_k, **self.options)
        return {"documents": to_haystack_documents(result, self.content), "trace": result.trace_json()}

    @component.output_types(documents=list[Document], trace=Any)
    async def run_async(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.run, query, top_k)
