"""The backend-independent LLM interface, with caching and token accounting.

Every backend implements one method, :meth:`LLM._generate`, that sends one
chat request and returns raw completions. :meth:`LLM.chat` wraps it with
input validation, the persistent response cache and usage counters, so the
evaluation harness can report LLM calls and prompt/completion tokens for any
method, and so a rerun of a synthesis job only pays for requests it has not
made before.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .cache import ResponseCache, cache_key

ROLES = {"system", "user", "assistant"}


class LLMError(RuntimeError):
    """The backend could not answer (unreachable, retries ran out, model not loadable)."""


class LLMUnavailableError(LLMError, ValueError):
    """The backend a spec names cannot be used at all: a file that is not a GGUF model, a server
    that refuses connections. Also a ValueError, so the CLI reports it on one line (exit 2)."""


class LLMRequestError(LLMError):
    """The backend refused this particular request (prompt longer than the context, a 4xx):
    other requests may still work, so batch jobs can skip the item instead of stopping."""


@dataclass
class Completion:
    """One generated answer.

    For ``n > 1`` the request's prompt tokens are counted on the first
    completion only, so summing over completions gives the request's usage.
    ``latency`` is the wall time of this call in seconds (near 0 when cached).
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    latency: float = 0.0
    finish_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    """Running totals of one LLM object (thread-safe through :meth:`add`).

    ``requests`` counts chat requests (cached or not), ``calls`` the ones that
    reached the backend; token totals include cached responses, the ``paid_*``
    totals only backend calls.
    """

    requests: int = 0
    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    paid_prompt_tokens: int = 0
    paid_completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, completions: list[Completion], cached: bool) -> None:
        p = sum(c.prompt_tokens for c in completions)
        c_ = sum(c.completion_tokens for c in completions)
        with self._lock:
            self.requests += 1
            self.prompt_tokens += p
            self.completion_tokens += c_
            if cached:
                self.cache_hits += 1
            else:
                self.calls += 1
                self.paid_prompt_tokens += p
                self.paid_completion_tokens += c_

    def to_json(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


def _check_messages(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(
                f"messages[{i}] must be a dict with role in {sorted(ROLES)} and a string content, got {m!r}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


class LLM:
    """Base class: subclasses set ``kind`` and implement ``model_id`` and ``_generate``."""

    kind = "base"
    #: how many requests :meth:`chat_many` sends at once
    max_concurrency: int = 1

    def __init__(self, cache: ResponseCache | str | bool | None = True):
        if cache is True:
            cache = ResponseCache()
        elif cache is False or cache is None:
            cache = None
        elif not isinstance(cache, ResponseCache):
            cache = ResponseCache(cache)
        self.cache: ResponseCache | None = cache
        self.usage = Usage()

    # -- to implement -------------------------------------------------------
    @property
    def model_id(self) -> str:
        """Identity of the weights, part of the cache key."""
        raise NotImplementedError

    def _extra_params(self) -> dict[str, Any]:
        """Backend settings that change outputs (e.g. repeat penalty); part of the cache key."""
        return {}

    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> list[dict[str, Any]]:
        """Send one request; return ``n`` dicts with text, prompt_tokens, completion_tokens, finish_reason."""
        raise NotImplementedError

    # -- public API ---------------------------------------------------------
    def chat(
        self,
        messages: Sequence[dict[str, str]],
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        json_schema: dict[str, Any] | None = None,
        n: int = 1,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
        """``n`` completions of a chat; served from the cache when this exact request was made before."""
        msgs = _check_messages(messages)
        if n < 1 or max_tokens < 1 or temperature < 0:
            raise ValueError(f"need n >= 1, max_tokens >= 1, temperature >= 0 (got {n}, {max_tokens}, {temperature})")
        params = {
            "temperature": float(temperature),
            "max_tokens": int(max_tokens),
            "json_schema": json_schema,
            "n": int(n),
            "stop": [stop] if isinstance(stop, str) else (list(stop) if stop else None),
            "seed": seed,
        }
        request = {"backend": self.kind, "model": self.model_id, "messages": msgs,
                   "params": {**params, **self._extra_params()}}
        key = cache_key(request)
        t0 = time.perf_counter()
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                dt = time.perf_counter() - t0
                out = [Completion(**{**c, "cached": True, "latency": dt}) for c in hit]
                self.usage.add(out, cached=True)
                return out
        raw = self._generate(msgs, params)
        dt = time.perf_counter() - t0
        stored = [
            {"text": r["text"], "prompt_tokens": int(r.get("prompt_tokens") or 0) if i == 0 else 0,
             "completion_tokens": int(r.get("completion_tokens") or 0), "finish_reason": r.get("finish_reason")}
            for i, r in enumerate(raw)
        ]
        if self.cache is not None:
            self.cache.put(key, request, stored)
        out = [Completion(**s, cached=False, latency=dt) for s in stored]
        self.usage.add(out, cached=False)
        return out

    def complete(self, prompt: str, *, system: str | None = None, **kwargs: Any) -> list[Completion]:
        """:meth:`chat` with one user message (and an optional system message)."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return self.chat(msgs, **kwargs)

    def chat_many(self, batch: Sequence[Sequence[dict[str, str]]], **kwargs: Any) -> list[list[Completion]]:
        """:meth:`chat` over many conversations, at most ``max_concurrency`` at once; results in input order."""
        if self.max_concurrency <= 1 or len(batch) <= 1:
            return [self.chat(m, **kwargs) for m in batch]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(batch))) as pool:
            return list(pool.map(lambda m: self.chat(m, **kwargs), batch))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_id!r})"
