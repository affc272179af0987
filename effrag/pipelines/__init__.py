"""Retrieval methods behind one interface, found by name (``effrag eval --method NAME``).

Add a method by writing ``effrag/pipelines/<name>.py`` with a :class:`Pipeline`
subclass decorated ``@register_pipeline("<name>")`` whose ``run`` returns a
:class:`Result`; keep heavy imports inside functions so listing methods stays cheap.
"""
from .base import (
                   DEFAULT_METHOD,
                   DEFAULT_RETRIEVER,
                   Pipeline,
                   available_pipelines,
                   build_pipeline,
                   dataset_option,
                   get_pipeline_class,
                   llm_options,
                   reader_options,
                   register_pipeline,
)
from .result import Chunk, Hop, Result

__all__ = ["DEFAULT_METHOD", "DEFAULT_RETRIEVER", "Pipeline", "Result", "Chunk", "Hop", "register_pipeline", "build_pipeline", "get_pipeline_class",
           "available_pipelines", "dataset_option", "llm_options", "reader_options"]
