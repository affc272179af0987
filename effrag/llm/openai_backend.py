"""Any OpenAI-compatible chat server (llama.cpp, vLLM, the OpenAI API) through the ``openai`` client.

Retries are ours, not the client's: connection errors, timeouts, 429 and 5xx
are retried with exponential backoff up to ``max_retries`` times, then an
:class:`~effrag.llm.base.LLMError` names the server and the last error; other
4xx errors (a bad request will stay bad) fail at once with
:class:`~effrag.llm.base.LLMRequestError`.

A server that cannot be connected to at all (connection refused, unknown host,
no TCP connection within ``connect_timeout``), or whose first answer is 401, 403
or 404 (wrong key, path or model name), is :class:`~effrag.llm.base.LLMUnavailableError`
(a ValueError: one ``effrag: error:`` line in the CLI). Until the server has
answered once, such errors get at most ``connect_retries`` retries, so a wrong
URL fails within about a second instead of after the full retry budget.

Servers differ in how they take a JSON schema, hence ``json_mode``:
``"json_object"`` sends ``{"type": "json_object", "schema": ...}`` (llama.cpp's
servers, which reject ``json_schema``), ``"json_schema"`` sends the OpenAI
structured-output form, ``"none"`` sends no response_format (the prompt alone
asks for JSON).
"""
from __future__ import annotations

import os
import random
import socket
import time
from typing import Any

from .base import LLM, LLMError, LLMRequestError, LLMUnavailableError
from .cache import ResponseCache

JSON_MODES = ("json_object", "json_schema", "none")


class OpenAIBackend(LLM):
    kind = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 4,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        connect_retries: int = 1,
        backoff: float = 0.5,
        json_mode: str = "json_object",
        cache: ResponseCache | str | bool | None = True,
    ):
        super().__init__(cache=cache)
        try:
            import openai
        except ImportError as e:  # pragma: no cover - openai is a core dependency
            raise ImportError("the openai package is required for OpenAIBackend (pip install openai)") from e
        if json_mode not in JSON_MODES:
            raise ValueError(f"json_mode must be one of {JSON_MODES}, got {json_mode!r}")
        if not model:
            raise ValueError("OpenAIBackend needs a model name (spec 'openai:URL#MODEL')")
        self._openai = openai
        self.base_url = base_url
        self.model = model
        self.max_concurrency = max(1, int(max_concurrency))
        self.max_retries = max(0, int(max_retries))
        self.connect_retries = max(0, int(connect_retries))
        self.connect_timeout = float(min(connect_timeout, timeout))
        self._answered = False  # has the server answered once? (then connection errors get every retry)
        self.backoff = backoff
        self.json_mode = json_mode
        key = api_key or os.environ.get("EFFRAG_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "sk-no-key"
        # max_retries=0: the client's own retries would hide our backoff and accounting.
        # A short connect timeout: a host that does not answer at all should not cost `timeout` per attempt.
        self.client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0,
                                    timeout=openai.Timeout(timeout, connect=self.connect_timeout))

    @property
    def spec(self) -> str:
        return f"openai:{self.base_url}#{self.model}"

    @property
    def model_id(self) -> str:
        # The URL is not part of the identity: the same model behind another port is the same model.
        return self.model

    def _extra_params(self) -> dict[str, Any]:
        return {"json_mode": self.json_mode}

    def _response_format(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None or self.json_mode == "none":
            return None
        if self.json_mode == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": True}}

    def _retryable(self, err: Exception) -> bool:
        o = self._openai
        if isinstance(err, (o.APIConnectionError, o.APITimeoutError, o.RateLimitError, o.InternalServerError)):
            return True
        return isinstance(err, o.APIStatusError) and getattr(err, "status_code", 0) >= 500

    def _connection_problem(self, err: Exception) -> str | None:
        """Why no connection could be made (refused, unknown host, connect timeout), or None when the
        error is not a connection failure (a read timeout or a 5xx means the server is there)."""
        chain, e = [], err
        while e is not None and len(chain) < 20:
            chain.append(e)
            e = e.__cause__ or e.__context__
        # by name: the client's transport is httpx or, in recent openai releases, its fork httpx2
        if not any(type(c).__name__ in ("ConnectError", "ConnectTimeout") for c in chain):
            return None
        if any(isinstance(c, ConnectionRefusedError) for c in chain):
            return f"connection refused at {self.base_url}: is the server running?"
        if any(isinstance(c, socket.gaierror) for c in chain):
            return f"cannot resolve the host of {self.base_url}: is the URL right?"
        if any(type(c).__name__ == "ConnectTimeout" for c in chain):
            return (f"no connection to {self.base_url} within {self.connect_timeout:g}s: "
                    "is the server running and reachable?")
        detail = " ".join(str(chain[-1]).split()) or type(chain[-1]).__name__
        return f"cannot connect to {self.base_url} ({detail}): is the server running?"

    def _request(self, messages: list[dict[str, str]], params: dict[str, Any], n: int, seed: int | None):
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": params["temperature"],
            "max_tokens": params["max_tokens"],
            "n": n,
        }
        if params["stop"]:
            kwargs["stop"] = params["stop"]
        if seed is not None:
            kwargs["seed"] = seed
        fmt = self._response_format(params["json_schema"])
        if fmt is not None:
            kwargs["response_format"] = fmt
        last: Exception | None = None
        attempts = 0
        while True:
            attempts += 1
            try:
                resp = self.client.chat.completions.create(**kwargs)
                self._answered = True
                return resp
            except self._openai.OpenAIError as e:
                last = e
                status = getattr(e, "status_code", None)
                if status in (401, 403, 404) and not self._answered:
                    # before any answer, these say the spec is wrong (bad path, model name or key), not the item
                    raise LLMUnavailableError(
                        f"LLM {self.spec}: the server answered {status} ({' '.join(str(e).split())[:200]}): "
                        + ("check the API key (EFFRAG_LLM_API_KEY)" if status != 404 else
                           "check the URL (usually ending in /v1) and the model name after '#'")) from e
                if not self._retryable(e):
                    raise LLMRequestError(
                        f"{self.base_url} rejected the request for model {self.model!r}: {e}") from e
                problem = self._connection_problem(e)
                budget = self.max_retries
                if problem is not None and not self._answered:
                    budget = min(budget, self.connect_retries)
                if attempts > budget:
                    if problem is not None:
                        raise LLMUnavailableError(
                            f"LLM {self.spec}: {problem} ({attempts} attempt{'s' * (attempts > 1)})") from e
                    break
                time.sleep(self.backoff * (2 ** (attempts - 1)) * (1 + 0.25 * random.random()))
        raise LLMError(
            f"no answer from {self.base_url} (model {self.model!r}) after {attempts} attempts: "
            f"{type(last).__name__}: {last}"
        ) from last

    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seed = params["seed"]
        # Some servers (llama.cpp) ignore n and answer once: ask again with shifted seeds until we have n.
        while len(out) < params["n"]:
            s = None if seed is None else seed + len(out)
            resp = self._request(messages, params, params["n"] - len(out), s)
            usage = getattr(resp, "usage", None)
            first = True
            for ch in resp.choices or []:
                out.append({
                    "text": ch.message.content or "",
                    "prompt_tokens": (getattr(usage, "prompt_tokens", 0) or 0) if first else 0,
                    "completion_tokens": 0,
                    "finish_reason": ch.finish_reason,
                })
                first = False
            if not resp.choices:
                raise LLMError(f"{self.base_url} returned no choices for model {self.model!r}")
            # completion tokens are reported per request: spread them over its choices
            total = getattr(usage, "completion_tokens", 0) or 0
            k = len(resp.choices)
            for j, item in enumerate(out[-k:]):
                item["completion_tokens"] = total // k + (1 if j < total % k else 0)
        # only the very first completion carries prompt tokens in LLM.chat's accounting: sum them there
        if len(out) > 1:
            out[0]["prompt_tokens"] = sum(o["prompt_tokens"] for o in out)
        return out[: params["n"]]
