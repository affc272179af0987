"""``effrag serve``: an HTTP retrieval service (FastAPI) over EfficientRAG or any effrag method.

    effrag serve --config configs/serve.yaml [--host 127.0.0.1 --port 8080]

Endpoints: ``POST /retrieve`` (``{"question": ...}`` or ``{"questions": [...]}``, optional
``top_k`` and EfficientRAG thresholds) -> chunks + trace per question; ``POST /answer``
(when the config names an LLM); ``GET /health``; the OpenAPI schema at ``/openapi.json``.
(No ``/docs`` page: FastAPI's Swagger UI loads its JavaScript from a CDN, which fails offline,
and no installed package ships those assets; the schema works with any OpenAPI viewer.)

The retriever and models load once, before the server starts listening (``effrag serve``),
so a start-up error is a one-line ``effrag: error: ...`` (exit 2), not a traceback; an app made
by :func:`create_app` without a built service loads it in its lifespan instead. Requests do not call the
models directly: they go through a :class:`~effrag.batching.MicroBatcher`, which gathers the questions
of concurrent requests for up to ``batch_window_ms`` (or ``max_batch`` questions) and
runs one ``retrieve_batch`` in a single worker thread. EfficientRAG and BM25 give the
same result for a question whatever its batch mates, so batching changes throughput,
never answers.

Shutdown (SIGTERM or SIGINT) is a drain, then exit code 0: for up to ``drain_s`` the server
keeps answering, each response with ``Connection: close`` (so keep-alive clients close their
connections themselves instead of racing a server-side close), and ``/health`` says
``draining`` with 503; then it stops listening, closes idle connections, lets in-flight
requests finish (up to ``graceful_timeout_s``), and the batcher answers every queued request
before the models are released. Every error response is JSON with a one-line ``error``;
request bodies over ``max_body_bytes`` get 413 without being read.
"""
from __future__ import annotations

from .app import create_app, error_response, one_line
from .config import (
                     LLMSection,
                     MethodSection,
                     RetrieverSection,
                     ServeConfig,
                     ServerSection,
                     bundled_samples,
                     load_config,
)
from .server import add_serve_parser, main, serve
from .service import Service, build_service

__all__ = ["ServeConfig", "RetrieverSection", "MethodSection", "LLMSection", "ServerSection", "load_config",
           "bundled_samples", "Service", "build_service", "create_app", "error_response", "one_line",
           "add_serve_parser", "serve", "main"]
