"""The FastAPI app: endpoints, request models, error format, body cap, drain state."""
import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ..batching import MicroBatcher, Unavailable
from ..pipelines import available_pipelines, get_pipeline_class
from .config import ServeConfig, ServerSection, load_config
from .service import Service, build_service

log = logging.getLogger("effrag.serve")



# ---------------------------------------------------------------------------- the app
def one_line(message: Any) -> str:
    """Error messages are one line: newlines and runs of spaces collapse."""
    return " ".join(str(message).split())


def error_response(status: int, message: Any, headers: dict | None = None, extra: dict | None = None):
    """The one error format of the service: ``{"error": "<one line>", **extra}`` with HTTP ``status``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": one_line(message), **(extra or {})}, headers=headers)


class Lifecycle:
    """State shared by the app and the server: draining after SIGTERM, HTTP requests in progress."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0  # HTTP requests being handled (queued, in the model, or generating), /health excluded


class _BodyTooLarge(Exception):
    pass


class _Guard:
    """Pure ASGI middleware around the app.

    * caps request bodies at ``max_body_bytes``: a larger ``Content-Length`` gets 413 before
      any of the body is read; a body without one (chunked) is counted as it arrives and gets
      413 at the first byte over the cap, so at most ``max_body_bytes`` + one chunk is buffered.
      The 413 carries ``Connection: close``, so the rest of the body is never read;
    * counts the requests in progress for ``/health``;
    * while draining, adds ``Connection: close`` to every response.
    """

    def __init__(self, app, lifecycle: Lifecycle, max_body_bytes: int):
        self.app, self.lifecycle, self.max_body_bytes = app, lifecycle, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, lc = self.max_body_bytes, self.lifecycle
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > limit:
            return await _send_json(send, 413, f"request body too large: {int(length)} bytes, the limit is {limit} "
                                               f"(server.max_body_bytes)", close=True)
        received, too_large, started = 0, False, False

        async def capped_receive():
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message):
            nonlocal started
            if too_large:  # whatever the app made of the exception, the answer is 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _send_json(send, 413, f"request body too large: over {limit} bytes "
                                                f"(server.max_body_bytes)", close=True)
                return
            if message["type"] == "http.response.start":
                started = True
                if lc.draining:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        counted = scope.get("path") != "/health"
        lc.in_flight += counted
        try:
            await self.app(scope, capped_receive, guarded_send)
        except _BodyTooLarge:
            pass  # answered just below, if the app did not answer at all
        finally:
            lc.in_flight -= counted
        if too_large and not started:
            await _send_json(send, 413, f"request body too large: over {limit} bytes (server.max_body_bytes)",
                             close=True)


async def _send_json(send, status: int, message: str, close: bool = False) -> None:
    import json

    body = json.dumps({"error": one_line(message)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})


def create_app(config: ServeConfig | dict | str | Path, service: Service | None = None):
    """The FastAPI app; the service named by ``config`` loads in its lifespan (or pass a built ``service``)."""
    from fastapi import FastAPI, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from effrag import __version__

    cfg = config if isinstance(config, ServeConfig) else load_config(config)
    rules = get_pipeline_class(cfg.method.name).request_rules()  # what the served method's class lets a request set
    RetrieveRequest, AnswerRequest = _request_models(cfg.server, rules)
    lifecycle = Lifecycle()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc = service or await asyncio.to_thread(build_service, cfg)
        batcher = MicroBatcher(svc.source.retrieve_batch, cfg.server.max_batch, cfg.server.batch_window_ms / 1000,
                               cfg.server.max_queue)
        batcher.start()
        app.state.service, app.state.batcher = svc, batcher
        app.state.llm_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effrag-llm")
        log.info("effrag serve ready: %s over %s passages", svc.info.get("method"), svc.info.get("corpus_size"))
        try:
            yield
        finally:
            drained = await batcher.close()
            app.state.llm_executor.shutdown(wait=True)
            log.info("effrag serve stopped: drained %d queued request(s); served %s", drained, batcher.stats)

    # docs_url=None: FastAPI's /docs and /redoc pages load Swagger UI / ReDoc from a CDN (blank offline), and
    # no installed package ships those assets; /openapi.json needs nothing from the network.
    app = FastAPI(title="effrag retrieval service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None,
                  description="Multi-hop retrieval (EfficientRAG and peers) over HTTP. See docs/integrations.md.")
    app.state.lifecycle = lifecycle
    app.add_middleware(_Guard, lifecycle=lifecycle, max_body_bytes=cfg.server.max_body_bytes)
    error = error_response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = [{k: v for k, v in e.items() if k not in ("ctx", "input", "url")} for e in exc.errors()]
        extra = [e for e in errs if e.get("type") == "extra_forbidden" and len(e.get("loc", ())) == 2]
        elsewhere = _other_methods_options(cfg.method.name, frozenset(rules)) if extra else frozenset()
        foreign = sorted({str(e["loc"][-1]) for e in extra if e["loc"][-1] in elsewhere})
        if foreign and len(foreign) == len(errs):  # another method's option: the request is well formed, not ours
            return error(400, f"method {cfg.method.name} takes no {', '.join(foreign)} "
                              f"(its per-request options: {', '.join(sorted(rules)) or 'none'})")
        msg = "; ".join(f"invalid JSON body (character {e['loc'][-1]})" if e.get("type") == "json_invalid" else
                        f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errs)
        return error(422, msg, extra={"detail": jsonable_encoder(errs)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        msg = exc.detail
        if exc.status_code == 404:
            msg = f"no such endpoint: {request.method} {request.url.path} (see /openapi.json)"
        elif exc.__cause__ is not None:  # e.g. FastAPI's 400 "There was an error parsing the body": say why
            msg = f"{msg}: {type(exc.__cause__).__name__}: {exc.__cause__}"
        return error(exc.status_code, msg, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    async def retrieve(request: Request, questions: list[str], body) -> tuple[list | None, Any]:
        svc, batcher = request.app.state.service, request.app.state.batcher
        opts = {t: getattr(body, t) for t in rules if getattr(body, t) is not None}
        bad = sorted(set(opts) - svc.source.options)
        if bad:  # the schema is the method's; a service built another way (a plain search) may take fewer
            return None, error(400, f"method {svc.info['method']} takes no {', '.join(bad)} "
                                    f"(its per-request options: {', '.join(sorted(svc.source.options)) or 'none'})")
        try:
            return await batcher.submit(questions, body.top_k, **opts), None
        except Unavailable as e:
            return None, error(503, e)
        except ValueError as e:
            return None, error(400, e)
        except Exception as e:  # noqa: BLE001 - the model failed on this request: 500 with the reason
            log.error("retrieval failed", exc_info=e)
            return None, error(500, f"retrieval failed: {type(e).__name__}: {e}")

    @app.post("/retrieve", summary="Retrieve chunks for one question or a batch")
    async def post_retrieve(body: RetrieveRequest, request: Request):
        questions = [body.question] if body.question is not None else list(body.questions)
        t0 = time.perf_counter()
        results, err = await retrieve(request, questions, body)
        if err is not None:
            return err
        return {"method": request.app.state.service.info["method"],
                "results": [r.to_json(include_trace=body.include_trace) for r in results],
                "latency_s": round(time.perf_counter() - t0, 6)}

    @app.post("/answer", summary="Retrieve, then answer with the configured LLM")
    async def post_answer(body: AnswerRequest, request: Request):
        svc = request.app.state.service
        if svc.generator is None:
            return error(501, "no LLM configured: add an 'llm:' section (e.g. llm: default) to the serve config")
        t0 = time.perf_counter()
        results, err = await retrieve(request, [body.question], body)
        if err is not None:
            return err
        r = results[0]
        gen = await asyncio.get_running_loop().run_in_executor(
            request.app.state.llm_executor, svc.generator.generate, body.question, r.chunks)
        return {"question": body.question, "answer": gen.answer, "generation": gen.to_json(),
                **{k: v for k, v in r.to_json(include_trace=body.include_trace).items() if k != "question"},
                "latency_s": round(time.perf_counter() - t0, 6)}

    @app.get("/health", summary="Status, method, model and corpus facts, queue and batching counters "
                                "(503 while draining or stopping)")
    async def health(request: Request):
        svc, batcher = request.app.state.service, request.app.state.batcher
        status = "draining" if lifecycle.draining else "shutting_down" if batcher.closing else "ok"
        body = {"status": status, "version": __version__, **svc.info, "answer": svc.generator is not None,
                "queue": {**batcher.counts(), "max": cfg.server.max_queue}, "in_flight": lifecycle.in_flight,
                "batching": batcher.stats,
                "limits": {k: getattr(cfg.server, k)
                           for k in ("max_batch", "max_top_k", "max_question_chars", "max_body_bytes")}}
        if status != "ok":
            return error(503, f"the service is {status.replace('_', ' ')}", extra=body)
        return body

    return app

@functools.cache
def _other_methods_options(method: str, rules: frozenset[str]) -> frozenset[str]:
    """The per-request options of every other registered method that the served one lacks: such a field is a
    well-formed request to the wrong method (400, naming what this one takes), not a typo (422). Asked only when a
    request has a field its schema lacks, and once: it imports every method's module."""
    names = set()
    for name in available_pipelines():
        if name != method:
            names |= set(get_pipeline_class(name).request_rules())
    return frozenset(names - set(rules))


def _request_models(server: ServerSection, rules: dict):
    """Request bodies with this server's limits and the options the served method's class lets a request set
    (:meth:`effrag.pipelines.Pipeline.request_rules`), each with the method's own rule, so they show in the
    OpenAPI schema."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model, model_validator

    Question = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1,
                                                 max_length=server.max_question_chars)]

    class _Base(BaseModel):
        model_config = ConfigDict(extra="forbid")
        top_k: Annotated[int | None, Field(ge=1, le=server.max_top_k, strict=True)] = None
        include_trace: Annotated[bool, Field(strict=True)] = True  # "yes" is an error, as a string top_k is

    _Options = create_model("_Options", __base__=_Base,
                            **{name: (_field_type(rule), None) for name, rule in rules.items()})

    class RetrieveRequest(_Options):
        question: Question | None = None
        questions: Annotated[list[Question] | None, Field(min_length=1, max_length=server.max_batch)] = None

        @model_validator(mode="after")
        def _one_of(self):
            if (self.question is None) == (self.questions is None):
                raise ValueError("give exactly one of 'question' (a string) or 'questions' (a list of strings)")
            return self

    class AnswerRequest(_Options):
        question: Question

    return RetrieveRequest, AnswerRequest


def _field_type(rule):
    """A method option's rule (as :class:`~effrag.pipelines.efficientrag.config.Rule`) as a request field's type (None: not
    set): its range, its choices, no string for a number and no number for a flag."""
    from typing import Annotated, Literal

    from pydantic import Field

    if rule.choices:
        return Literal[tuple(rule.choices)] | None
    if rule.type is bool:
        return Annotated[bool | None, Field(strict=True)]
    if rule.type is float:  # strict: a string is not a number (an integer is: 1 for 1.0); nor NaN or infinity
        return Annotated[float | None, Field(ge=rule.min, le=rule.max, strict=True, allow_inf_nan=False)]
    return Annotated[rule.type | None, Field(ge=rule.min, le=rule.max, strict=True)]


