"""Retrieval methods behind one interface, found by name (``effrag eval --method NAME``).

Add a method by writing ``effrag/pipelines/<name>.py`` with a :class:`Pipeline`
subclass decorated ``@register_pipeline("<name>")``; keep heavy imports inside
functions so listing methods stays cheap.
"""
from .base import (Pipeline, available_pipelines, build_pipeline, get_pipeline_class,
                   register_pipeline)

__all__ = ["Pipeline", "register_pipeline", "build_pipeline", "get_pipeline_class", "available_pipelines"]
