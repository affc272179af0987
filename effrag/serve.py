"""``effrag serve``: an HTTP retrieval service (FastAPI) over EfficientRAG or any effrag method.

    effrag serve --config configs/serve.yaml [--host 127.0.0.1 --port 8080]

Endpoints: ``POST /retrieve`` (``{"question": ...}`` or ``{"questions": [...]}``, optional
``top_k`` and EfficientRAG thresholds) -> chunks + trace per question; ``POST /answer``
(when the config names an LLM); ``GET /health``; OpenAPI docs at ``/docs``.

The retriever and models load once, in the app's lifespan. Requests do not call the
models directly: they go through a :class:`~effrag.batching.MicroBatcher`, which gathers the questions
of concurrent requests for up to ``batch_window_ms`` (or ``max_batch`` questions) and
runs one ``retrieve_batch`` in a single worker thread. EfficientRAG and BM25 give the
same result for a question whatever its batch mates, so batching changes throughput,
never answers. On shutdown the queue is drained before the models are released.
"""
import argparse
import asyncio
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .batching import MicroBatcher, Unavailable

log = logging.getLogger("effrag.serve")
THRESHOLDS = ("tag_threshold", "token_threshold", "filter_threshold")


# ---------------------------------------------------------------------------- config
@dataclass
class RetrieverSection:
    kind: str = "bm25"  # bm25 | dense | hybrid, built over the corpus at startup
    sample: list[str] | None = None  # bundled sample datasets: train+dev contexts pooled
    corpus: str | None = None  # a corpus.jsonl
    index: str | None = None  # a saved index folder (`effrag index build`); overrides kind
    cache_dir: str | None = None  # dense/hybrid index cache (default: the CLI's)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class MethodSection:
    name: str = "direct-r"  # direct-r | efficientrag | any registered pipeline
    k: int = 10  # passages per question for direct-r and pipelines
    labeler: str | None = None
    filter: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # EfficientRAGConfig fields / pipeline options


@dataclass
class LLMSection:
    spec: str = "default"  # effrag.llm spec: default | gguf:PATH | openai:URL#MODEL
    options: dict[str, Any] = field(default_factory=dict)  # load_llm options (cache=, n_ctx=, ...)
    dataset: str | None = None  # picks the paper's QA prompt
    context: str = "chunks"  # or kept_words
    max_tokens: int = 64
    max_chunks: int | None = None


@dataclass
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int = 32  # questions per request, and per model call
    max_top_k: int = 100
    max_question_chars: int = 2000
    batch_window_ms: float = 5.0
    max_queue: int = 1024  # pending requests before 503
    log_level: str = "info"


@dataclass
class ServeConfig:
    retriever: RetrieverSection = field(default_factory=RetrieverSection)
    method: MethodSection = field(default_factory=MethodSection)
    llm: LLMSection | None = None
    server: ServerSection = field(default_factory=ServerSection)
    path: str = "<dict>"


def _section(cls: type, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    obj = cls(**data)
    for name in known:
        value, default = getattr(obj, name), getattr(cls(), name)
        if value is None or default is None:
            continue
        ok = isinstance(value, type(default)) or (type(default) is float and type(value) is int)
        if not ok or isinstance(value, bool) != isinstance(default, bool):
            raise ValueError(f"{where}.{name}: expected {type(default).__name__}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0 and name != "port":
            raise ValueError(f"{where}.{name}: must be positive, got {value!r}")
    return obj


def load_config(source: str | Path | dict[str, Any]) -> ServeConfig:
    """A :class:`ServeConfig` from a YAML file or a dict; errors name the file and the key."""
    import yaml

    where = "<dict>"
    if not isinstance(source, dict):
        where = str(source)
        if not Path(source).is_file():
            raise FileNotFoundError(f"serve config not found: {source}")
        try:
            source = yaml.safe_load(Path(source).read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{where}: invalid YAML: {e}") from None
        if not isinstance(source, dict):
            raise ValueError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(source) - {"retriever", "method", "llm", "server"})
    if unknown:
        raise ValueError(f"{where}: unknown section(s) {', '.join(unknown)} (known: retriever, method, llm, server)")
    llm = source.get("llm")
    cfg = ServeConfig(retriever=_section(RetrieverSection, source.get("retriever"), f"{where}: retriever"),
                      method=_section(MethodSection, source.get("method"), f"{where}: method"),
                      llm=None if llm is None else _section(LLMSection, {"spec": llm} if isinstance(llm, str) else llm,
                                                            f"{where}: llm"),
                      server=_section(ServerSection, source.get("server"), f"{where}: server"), path=where)
    r, m = cfg.retriever, cfg.method
    if isinstance(r.sample, str):
        r.sample = [r.sample]
    if sum(x is not None for x in (r.sample, r.corpus, r.index)) != 1:
        raise ValueError(f"{where}: retriever needs exactly one of sample, corpus, index")
    for key, path in (("retriever.corpus", r.corpus), ("retriever.index", r.index),
                      ("method.labeler", m.labeler), ("method.filter", m.filter)):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{where}: {key}: {path} does not exist")
    if r.index is None and r.kind not in ("bm25", "dense", "hybrid"):
        raise ValueError(f"{where}: retriever.kind must be bm25, dense or hybrid, got {r.kind!r}")
    if m.name not in ("direct-r", "efficientrag", "efficient-rag"):
        from effrag.pipelines import get_pipeline_class

        try:
            get_pipeline_class(m.name)
        except ValueError as e:
            raise ValueError(f"{where}: method.name: {e}") from None
    if m.name in ("efficientrag", "efficient-rag") and (m.labeler is None or m.filter is None):
        raise ValueError(f"{where}: method efficientrag needs method.labeler and method.filter (checkpoint folders)")
    return cfg


# ---------------------------------------------------------------------------- the loaded service
@dataclass
class Service:
    """What the app serves: a chunk source, an optional answer generator, and facts for /health."""

    source: Any  # effrag.integrations.ChunkSource
    generator: Any = None  # effrag.pipelines.generation.Generator
    info: dict[str, Any] = field(default_factory=dict)


def _build_retriever(r: RetrieverSection):
    from effrag.data import Corpus, build_corpus, sample_path
    from effrag.retrieval import build_retriever, cached_retriever, load_retriever

    if r.index:
        ret = load_retriever(r.index, **r.options)
        return ret, ret.corpus
    if r.corpus:
        corpus = Corpus.from_jsonl(r.corpus)
    else:
        files = []
        for ds in r.sample:
            for split in ("train", "dev"):
                try:
                    files.append(sample_path(ds, split))
                except FileNotFoundError:
                    if split == "dev":
                        raise
        corpus = build_corpus(files)
    if r.kind == "bm25":
        return build_retriever("bm25", corpus, show_progress=False, **r.options), corpus
    from effrag.cli import _default_cache

    return cached_retriever(r.kind, corpus, r.cache_dir or _default_cache(), **r.options), corpus


def build_service(cfg: ServeConfig) -> Service:
    """Load the retriever, the method and the LLM named by ``cfg`` (slow: done once at startup)."""
    from effrag.integrations import ChunkSource

    t0 = time.perf_counter()
    retriever, corpus = _build_retriever(cfg.retriever)
    m = cfg.method
    if m.name in ("efficientrag", "efficient-rag"):
        from effrag.api import EfficientRAG

        source = ChunkSource(EfficientRAG.from_pretrained(m.labeler, m.filter, retriever=retriever, **m.options))
    elif m.name == "direct-r":  # Direct-R is one search: per-request top_k reaches the retriever
        source = ChunkSource(retriever, k=m.k)
    else:
        from effrag.pipelines import build_pipeline

        source = ChunkSource(build_pipeline(m.name, retriever, k=m.k, **m.options), corpus=corpus)
    generator = None
    if cfg.llm is not None:
        from effrag.llm import load_llm
        from effrag.pipelines.generation import Generator

        generator = Generator(load_llm(cfg.llm.spec, **cfg.llm.options), dataset=cfg.llm.dataset,
                              context=cfg.llm.context, max_tokens=cfg.llm.max_tokens, max_chunks=cfg.llm.max_chunks)
    info = {"method": m.name, "source": source.describe(), "retriever": getattr(retriever, "kind", cfg.retriever.kind),
            "corpus_size": len(corpus) if corpus is not None else None,
            "corpus_fingerprint": corpus.fingerprint() if corpus is not None else None,
            "model": {"labeler": m.labeler, "filter": m.filter} if m.labeler else None,
            "llm": cfg.llm.spec if cfg.llm else None, "load_s": round(time.perf_counter() - t0, 3)}
    return Service(source=source, generator=generator, info=info)


# ---------------------------------------------------------------------------- the app
def create_app(config: ServeConfig | dict | str | Path, service: Service | None = None):
    """The FastAPI app; the service named by ``config`` loads in its lifespan (or pass a built ``service``)."""
    from fastapi import FastAPI, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from effrag import __version__

    cfg = config if isinstance(config, ServeConfig) else load_config(config)
    models = _request_models(cfg.server)
    RetrieveRequest, AnswerRequest = models

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

    app = FastAPI(title="effrag retrieval service", version=__version__, lifespan=lifespan,
                  description="Multi-hop retrieval (EfficientRAG and peers) over HTTP. See docs/integrations.md.")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": message})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = [{k: v for k, v in e.items() if k not in ("ctx", "input", "url")} for e in exc.errors()]
        msg = "; ".join(f"invalid JSON body (character {e['loc'][-1]})" if e.get("type") == "json_invalid" else
                        f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errs)
        return JSONResponse(status_code=422, content={"error": msg, "detail": jsonable_encoder(errs)})

    async def retrieve(request: Request, questions: list[str], body) -> tuple[list | None, JSONResponse | None]:
        svc, batcher = request.app.state.service, request.app.state.batcher
        opts = {t: getattr(body, t) for t in THRESHOLDS if getattr(body, t) is not None}
        bad = sorted(set(opts) - svc.source.options)
        if bad:
            return None, error(400, f"method {svc.info['method']} takes no {', '.join(bad)} "
                                    f"(only EfficientRAG has thresholds)")
        try:
            return await batcher.submit(questions, body.top_k, **opts), None
        except Unavailable as e:
            return None, error(503, str(e))
        except ValueError as e:
            return None, error(400, str(e))

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

    @app.get("/health", summary="Status, method, model and corpus facts, batching counters")
    async def health(request: Request):
        svc, batcher = request.app.state.service, request.app.state.batcher
        return {"status": "shutting_down" if batcher._closing else "ok", "version": __version__, **svc.info,
                "answer": svc.generator is not None, "queue": batcher.queue.qsize(), "batching": batcher.stats,
                "limits": {k: getattr(cfg.server, k) for k in ("max_batch", "max_top_k", "max_question_chars")}}

    return app


def _request_models(server: ServerSection):
    """Request bodies with this server's limits (so they show in the OpenAPI schema)."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

    Question = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1,
                                                 max_length=server.max_question_chars)]
    Threshold = Annotated[float | None, Field(ge=0.0, le=1.0, strict=True)]

    class _Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        top_k: Annotated[int | None, Field(ge=1, le=server.max_top_k, strict=True)] = None
        tag_threshold: Threshold = None
        token_threshold: Threshold = None
        filter_threshold: Threshold = None
        include_trace: Annotated[bool, Field(strict=True)] = True  # "yes" is an error, as a string top_k is

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


# ---------------------------------------------------------------------------- command line
def add_serve_parser(sub) -> None:
    """``effrag serve``: hooked into effrag/cli.py's SUBCOMMANDS as ``effrag.serve:add_serve_parser``."""
    p = sub.add_parser("serve", help="HTTP retrieval service: POST /retrieve, /answer; GET /health, /docs")
    p.add_argument("--config", required=True, metavar="FILE", help="serve config YAML (see configs/serve.yaml)")
    p.add_argument("--host", help="bind address (default: the config's, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: the config's, 8080)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args) -> None:
    cfg = load_config(args.config)
    for key in ("host", "port", "log_level"):
        if getattr(args, key, None) is not None:
            setattr(cfg.server, key, getattr(args, key))
    serve(cfg)


def serve(cfg: ServeConfig) -> None:
    """Run uvicorn until SIGINT/SIGTERM; in-flight and queued requests finish first."""
    import uvicorn

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(cfg.server.log_level.upper())
    uvicorn.run(create_app(cfg), host=cfg.server.host, port=cfg.server.port, log_level=cfg.server.log_level,
                timeout_graceful_shutdown=30)


def main(argv: list[str] | None = None) -> int:
    """``python -m effrag.serve --config FILE`` (the same as ``effrag serve``)."""
    parser = argparse.ArgumentParser(prog="effrag")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"effrag: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
