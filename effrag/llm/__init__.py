"""LLM access for synthesis and the LLM-based baselines.

``load_llm(spec)`` returns an :class:`LLM` (``chat`` / ``complete`` /
``chat_many`` returning :class:`Completion` objects with token counts) backed
by an OpenAI-compatible server, an in-process GGUF model (llama.cpp) or transformers, with a persistent
sqlite response cache. ``parse_json_loose`` reads JSON out of messy generations.
"""
from .base import LLM, Completion, LLMError, LLMRequestError, LLMUnavailableError, Usage
from .cache import ResponseCache, default_cache_path
from .jsonparse import JSONParseError, parse_json_loose
from .spec import LLMSpec, load_llm, parse_spec

__all__ = [
    "LLM", "Completion", "LLMError", "LLMRequestError", "LLMUnavailableError", "Usage",
    "ResponseCache", "default_cache_path",
    "JSONParseError", "parse_json_loose",
    "LLMSpec", "load_llm", "parse_spec",
    "OpenAIBackend", "GGUFBackend", "TransformersBackend", "default_gguf_path",
]


def __getattr__(name):  # backends import lazily: llama_cpp is optional
    if name == "OpenAIBackend":
        from .openai_backend import OpenAIBackend

        return OpenAIBackend
    if name == "TransformersBackend":
        from .hf_backend import TransformersBackend

        return TransformersBackend
    if name in ("GGUFBackend", "default_gguf_path"):
        from . import gguf

        return getattr(gguf, name)
    raise AttributeError(name)
