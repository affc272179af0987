"""``effrag serve``: the real server in a subprocess on 127.0.0.1, called over HTTP with httpx.

BM25 Direct-R over the bundled HotpotQA sample for the endpoint, validation,
concurrency and shutdown tests; one EfficientRAG server with tiny saved
Labeler/Filter checkpoints (and the bundled SmolLM2 for /answer when the llm extra
is installed).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from effrag.data import build_corpus, sample_path

QUESTIONS_FILE = sample_path("hotpotqa", "dev")
MAX_BATCH = 8
MAX_BODY = 16384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m effrag.serve --config FILE`` on a free loopback port; SIGTERM on exit."""

    def __init__(self, config: dict, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg_path, self.log_path = tmp / "serve.yaml", tmp / "serve.log"
        self.cfg_path.write_text(yaml.safe_dump(config))
        self.returncode: int | None = None

    def __enter__(self) -> "Server":
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "effrag.serve", "--config", str(self.cfg_path),
                                      "--port", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server did not come up in 120 s:\n{self.log}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.returncode = self.proc.returncode
        return self.returncode

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def log(self) -> str:
        return self.log_path.read_text()


def clean_exit(srv: Server) -> bool:
    """A SIGTERM'd server that drained and stopped exits 0 (uvicorn alone would re-raise SIGTERM: 143)."""
    return srv.returncode == 0 and "Application shutdown complete" in srv.log and "effrag serve stopped" in srv.log


def bm25_config(**server) -> dict:
    return {"retriever": {"kind": "bm25", "sample": ["hotpotqa"]}, "method": {"name": "direct-r", "k": 5},
            "server": {"max_batch": MAX_BATCH, "max_top_k": 20, "max_question_chars": 300, "batch_window_ms": 50,
                       "max_body_bytes": MAX_BODY, "log_level": "info", **server}}


@pytest.fixture(scope="module")
def questions():
    from effrag.data import load_questions

    return [q.question for q in load_questions(QUESTIONS_FILE)[:12]]


@pytest.fixture(scope="module")
def corpus():
    return build_corpus([sample_path("hotpotqa", "train"), QUESTIONS_FILE])


@pytest.fixture(scope="module")
def bm25(corpus):
    from effrag.retrieval import build_retriever

    return build_retriever("bm25", corpus, show_progress=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(bm25_config(), tmp_path_factory.mktemp("serve"))
    with srv:
        yield srv
    assert clean_exit(srv), srv.log


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


# ---------------------------------------------------------------------- endpoints

def test_health_and_openapi(server, corpus):
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["method"] == "direct-r" and h["retriever"] == "bm25"
    assert h["corpus_size"] == len(corpus) and h["corpus_fingerprint"] == corpus.fingerprint()
    assert h["answer"] is False and h["limits"]["max_batch"] == MAX_BATCH
    assert h["queue"] == {"queued": 0, "in_model": 0, "max": 1024} and h["in_flight"] == 0
    assert h["limits"]["max_body_bytes"] == MAX_BODY
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/retrieve", "/answer", "/health"} <= set(spec["paths"])


def test_no_docs_page_that_needs_a_cdn(server):
    """FastAPI's /docs loads Swagger UI from cdn.jsdelivr.net (blank offline) and no installed package ships the
    assets, so /docs and /redoc are off; the schema at /openapi.json needs no network."""
    import importlib.util

    assert importlib.util.find_spec("swagger_ui_bundle") is None  # if it gets installed, serve /docs from it
    for path in ("/docs", "/redoc"):
        r = httpx.get(server.url + path)
        assert r.status_code == 404 and "no such endpoint" in r.json()["error"]
    spec = httpx.get(server.url + "/openapi.json")
    assert spec.status_code == 200 and "cdn" not in spec.text and spec.json()["info"]["title"]


def test_retrieve_single_and_batch_match_the_retriever(server, bm25, questions):
    r = post(server, "/retrieve", {"question": questions[0]})
    assert r.status_code == 200
    res = r.json()["results"]
    assert len(res) == 1 and res[0]["question"] == questions[0]
    hits = bm25.search([questions[0]], 5)[0]
    assert [c["id"] for c in res[0]["chunks"]] == [h.id for h in hits]
    assert [c["title"] for c in res[0]["chunks"]] == [h.title for h in hits]
    assert res[0]["trace"]["hops"][0]["retrieved"] == [h.id for h in hits]
    top3 = post(server, "/retrieve", {"question": questions[0], "top_k": 3, "include_trace": False}).json()
    assert [c["id"] for c in top3["results"][0]["chunks"]] == [h.id for h in bm25.search([questions[0]], 3)[0]]
    assert "trace" not in top3["results"][0]
    batch = post(server, "/retrieve", {"questions": questions[:MAX_BATCH]}).json()["results"]
    assert [b["question"] for b in batch] == questions[:MAX_BATCH]
    assert [[c["id"] for c in b["chunks"]] for b in batch] == \
        [[h.id for h in hs] for hs in bm25.search(questions[:MAX_BATCH], 5)]


@pytest.mark.parametrize("body, status, message", [
    ({"question": ""}, 422, "question: String should have at least 1 character"),
    ({"question": "   "}, 422, "question: String should have at least 1 character"),
    ({"question": 5}, 422, "question: Input should be a valid string"),
    ({"questions": ["a"] * (MAX_BATCH + 1)}, 422, f"questions: List should have at most {MAX_BATCH} items"),
    ({"questions": []}, 422, "questions: List should have at least 1 item"),
    ({"questions": "not a list"}, 422, "questions: Input should be a valid list"),
    ({"questions": ["ok", 3]}, 422, "questions.1: Input should be a valid string"),
    ({"question": "x" * 301}, 422, "question: String should have at most 300 characters"),
    ({}, 422, "give exactly one of 'question'"),
    ({"question": "a", "questions": ["b"]}, 422, "give exactly one of 'question'"),
    ({"question": "a", "top_k": 0}, 422, "top_k: Input should be greater than or equal to 1"),
    ({"question": "a", "top_k": 21}, 422, "top_k: Input should be less than or equal to 20"),
    ({"question": "a", "top_k": "3"}, 422, "top_k: Input should be a valid integer"),
    ({"question": "a", "qustion": "typo"}, 422, "qustion: Extra inputs are not permitted"),
    ({"question": "a", "tag_threshold": 1.5}, 422, "tag_threshold: Input should be less than or equal to 1"),
    ({"question": "a", "tag_threshold": 0.4}, 400, "method direct-r takes no tag_threshold"),
    ({"question": "a", "include_trace": "yes"}, 422, "include_trace: Input should be a valid boolean"),
])
def test_bad_requests_get_clear_errors(server, body, status, message):
    r = post(server, "/retrieve", body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_invalid_json_and_answer_without_llm(server):
    r = httpx.post(server.url + "/retrieve", content=b'{"question": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "invalid JSON body" in r.json()["error"]
    r = httpx.post(server.url + "/retrieve", content=b'{"question": "\xff"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error parsing the body: UnicodeDecodeError" in r.json()["error"]
    r = post(server, "/answer", {"question": "Who?"})
    assert r.status_code == 501 and "no LLM configured" in r.json()["error"]


def test_body_over_the_cap_gets_413_on_the_real_server(server, questions):
    """Content-Length over server.max_body_bytes: 413 with an error, and the connection is closed (body unread)."""
    big = {"question": questions[0], "pad": "x" * MAX_BODY}
    r = post(server, "/retrieve", big)
    assert r.status_code == 413 and r.headers["connection"] == "close"
    assert r.json() == {"error": f"request body too large: {len(r.request.content)} bytes, the limit is {MAX_BODY} "
                                 "(server.max_body_bytes)"}
    assert post(server, "/retrieve", {"question": questions[0]}).status_code == 200  # the server is fine


def test_concurrent_requests_are_batched_and_consistent(server, questions):
    sequential = [post(server, "/retrieve", {"question": q}).json()["results"][0] for q in questions]
    before = httpx.get(server.url + "/health").json()["batching"]

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            bodies = [{"question": q} for q in questions] + [{"questions": questions[i:i + 3]} for i in (0, 3)] + \
                     [{"question": questions[0], "top_k": 2}, {"question": questions[1], "include_trace": False}]
            return bodies, await asyncio.gather(*(client.post("/retrieve", json=b) for b in bodies))

    bodies, responses = asyncio.run(burst())
    assert len(responses) == 16 and all(r.status_code == 200 for r in responses)
    for r in responses[:12]:
        assert r.json()["results"] == [sequential[questions.index(r.json()["results"][0]["question"])]]
    assert responses[12].json()["results"] == sequential[0:3] and responses[13].json()["results"] == sequential[3:6]
    assert [c["id"] for c in responses[14].json()["results"][0]["chunks"]] == \
        [c["id"] for c in sequential[0]["chunks"][:2]]
    after = httpx.get(server.url + "/health").json()["batching"]
    assert after["requests"] - before["requests"] == 16
    assert after["batches"] - before["batches"] < 16, "concurrent requests should share model calls"


def test_shutdown_drains_queued_requests(tmp_path, questions):
    """SIGTERM while requests wait in the batch window: they still get their results, then a clean exit."""
    srv = Server(bm25_config(batch_window_ms=2000), tmp_path)
    with srv:
        async def during_shutdown():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                pending = [asyncio.ensure_future(client.post("/retrieve", json={"question": q})) for q in questions[:4]]
                await asyncio.sleep(0.8)  # all four are queued, waiting for batch mates
                srv.proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*pending)

        responses = asyncio.run(during_shutdown())
        srv.stop()
    assert [r.status_code for r in responses] == [200] * 4
    assert [r.json()["results"][0]["question"] for r in responses] == questions[:4]
    assert clean_exit(srv), srv.log
    assert "drained" in srv.log and "'requests': 4, 'questions': 4, 'batches': 1" in srv.log
    with pytest.raises(httpx.TransportError):
        httpx.get(srv.url + "/health", timeout=2)


def test_sigterm_drains_keep_alive_connections_and_exits_0(tmp_path, questions):
    """SIGTERM with keep-alive clients: requests in flight, requests sent afterwards on idle pooled connections,
    and a connection opened before SIGTERM whose request comes after it all get a 200 (with Connection: close);
    /health says draining (503) meanwhile; then the process exits 0."""
    srv = Server(bm25_config(batch_window_ms=300, drain_s=5), tmp_path)
    raw_body = json.dumps({"question": questions[0], "include_trace": False}).encode()

    async def scenario():
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as idle, \
                httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as busy:
            # four keep-alive connections per client (concurrent requests in a 300 ms batch window)
            warm = await asyncio.gather(*(c.post("/retrieve", json={"question": q})
                                          for c in (idle, busy) for q in questions[:4]))
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)  # connected, request not sent yet
            in_flight = [asyncio.ensure_future(busy.post("/retrieve", json={"question": q})) for q in questions[4:8]]
            await asyncio.sleep(0.1)  # they wait in the batch window
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as fresh:
                health = await fresh.get("/health")
            late = await asyncio.gather(*(idle.post("/retrieve", json={"question": q}) for q in questions[8:12]))
            writer.write(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(raw_body), raw_body))
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), 30)  # to EOF: the server closes after answering
            writer.close()
            return warm, await asyncio.gather(*in_flight), late, raw, health

    with srv:
        warm, in_flight, late, raw, health = asyncio.run(scenario())
        srv.stop()
    assert [r.status_code for r in warm + in_flight + late] == [200] * 16
    assert [r.json()["results"][0]["question"] for r in in_flight + late] == questions[4:12]
    assert all(r.headers["connection"] == "close" for r in in_flight + late)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert json.loads(body)["results"][0]["question"] == questions[0]
    assert health.status_code == 503 and health.json()["status"] == "draining" and "error" in health.json()
    assert srv.returncode == 0 and clean_exit(srv), srv.log
    assert "draining" in srv.log and "Traceback" not in srv.log


def test_sigint_exits_0(tmp_path):
    with Server(bm25_config(), tmp_path) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        srv.proc.send_signal(signal.SIGINT)
        srv.proc.wait(timeout=60)
        srv.stop()
    assert clean_exit(srv), srv.log


# ---------------------------------------------------------------------- in-process: counters, limits, error format

class GatedSource:
    """BM25 Direct-R whose model calls wait for ``gate``; a question "boom" makes the call fail."""

    options = frozenset()

    def __init__(self, bm25):
        import threading

        from effrag.integrations import ChunkSource

        self.inner, self.gate = ChunkSource(bm25, k=5), threading.Event()
        self.gate.set()

    def retrieve_batch(self, questions, top_k=None, **options):
        assert self.gate.wait(30)
        if "boom" in questions:
            raise RuntimeError("the model exploded\non two lines")
        return self.inner.retrieve_batch(questions, top_k=top_k)


async def in_process(source, **server):
    """(app, client, exit stack): the app with a given source, its lifespan entered, an ASGI httpx client."""
    import contextlib

    from effrag.serve import Service, create_app, load_config

    app = create_app(load_config(bm25_config(**server)),
                     service=Service(source=source, info={"method": "gated", "corpus_size": 0}))
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(app.router.lifespan_context(app))
    client = await stack.enter_async_context(httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                               base_url="http://effrag.test", timeout=30))
    return app, client, stack


async def wait_for(client, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        h = (await client.get("/health")).json()
        if predicate(h) or time.monotonic() > deadline:
            return h
        await asyncio.sleep(0.01)


def test_health_counts_queued_and_in_flight_requests(bm25, questions):
    """16 concurrent requests, max_batch 8, the model blocked: 8 in the model call, 8 queued, 16 in flight."""
    source = GatedSource(bm25)

    async def scenario():
        # a window long enough that all 16 requests arrive before the first batch closes (a 5 ms window let a
        # slow event loop close it with 2, leaving 14 queued): the batch closes as soon as it holds MAX_BATCH
        app, client, stack = await in_process(source, batch_window_ms=500)
        async with stack:
            source.gate.clear()
            tasks = [asyncio.ensure_future(client.post("/retrieve", json={"question": questions[i % 12]}))
                     for i in range(16)]
            during = await wait_for(client, lambda h: h["queue"]["in_model"] == MAX_BATCH and h["in_flight"] == 16)
            source.gate.set()
            responses = await asyncio.gather(*tasks)
            after = (await client.get("/health")).json()
        return during, responses, after

    during, responses, after = asyncio.run(scenario())
    assert during["queue"] == {"queued": 8, "in_model": 8, "max": 1024} and during["in_flight"] == 16
    assert [r.status_code for r in responses] == [200] * 16
    assert after["queue"] == {"queued": 0, "in_model": 0, "max": 1024} and after["in_flight"] == 0
    assert after["batching"]["requests"] == 16


def test_every_error_response_is_json_with_a_one_line_error(bm25, questions):
    """400, 404, 405, 413 (declared and chunked bodies), 422, 500, 501, 503: {"error": "<one line>"}."""
    source = GatedSource(bm25)

    async def chunks(n, size=4096):
        for _ in range(n):
            yield b" " * size

    async def scenario():
        app, client, stack = await in_process(source, max_batch=1, max_queue=2, batch_window_ms=1)
        got = {}
        async with stack:
            json_ct = {"content-type": "application/json"}
            got["400 threshold"] = await client.post("/retrieve", json={"question": "a", "tag_threshold": 0.5})
            got["400 body"] = await client.post("/retrieve", content=b'{"question": "\xff"}', headers=json_ct)
            got["404"] = await client.get("/nope")
            got["405"] = await client.put("/retrieve")
            got["413 declared"] = await client.post("/retrieve", content=b"x" * (MAX_BODY + 1), headers=json_ct)
            got["413 chunked"] = await client.post("/retrieve", content=chunks(8), headers=json_ct)
            got["422"] = await client.post("/retrieve", json={"question": ""})
            got["500"] = await client.post("/retrieve", json={"question": "boom"})
            got["501"] = await client.post("/answer", json={"question": "a"})
            source.gate.clear()  # one request in the model, two queued (max_queue 2): the next gets 503
            first = asyncio.ensure_future(client.post("/retrieve", json={"question": questions[0]}))
            await wait_for(client, lambda h: h["queue"]["in_model"] == 1)
            queued = [asyncio.ensure_future(client.post("/retrieve", json={"question": q})) for q in questions[1:3]]
            await wait_for(client, lambda h: h["queue"]["queued"] == 2)
            got["503"] = await client.post("/retrieve", json={"question": questions[3]})
            source.gate.set()
            ok = await asyncio.gather(first, *queued)
            got["200 at the cap"] = await client.post("/retrieve", headers=json_ct, content=json.dumps(
                {"question": questions[0], "include_trace": False}).encode().ljust(MAX_BODY))
        return got, ok

    got, ok = asyncio.run(scenario())
    assert [r.status_code for r in ok] == [200] * 3 and got.pop("200 at the cap").status_code == 200
    for name, r in got.items():
        assert r.status_code == int(name[:3]), (name, r.text)
        assert r.headers["content-type"] == "application/json", name
        err = r.json()["error"]
        assert isinstance(err, str) and err and "\n" not in err, (name, err)
    assert "takes no tag_threshold" in got["400 threshold"].json()["error"]
    assert "UnicodeDecodeError" in got["400 body"].json()["error"]
    assert got["404"].json()["error"] == "no such endpoint: GET /nope (see /openapi.json)"
    assert got["413 declared"].json()["error"] == \
        f"request body too large: {MAX_BODY + 1} bytes, the limit is {MAX_BODY} (server.max_body_bytes)"
    assert got["413 chunked"].json()["error"] == f"request body too large: over {MAX_BODY} bytes (server.max_body_bytes)"
    assert got["413 chunked"].headers["connection"] == "close"
    assert got["500"].json()["error"] == "retrieval failed: RuntimeError: the model exploded on two lines"
    assert "too many pending requests (2)" in got["503"].json()["error"]


def test_chunked_body_is_not_read_past_the_cap(bm25):
    """A body without Content-Length is read only until it passes the cap, not to its end."""
    sent = 0

    async def endless():
        nonlocal sent
        while sent < 100 * MAX_BODY:
            sent += 1024
            yield b" " * 1024

    async def scenario():
        app, client, stack = await in_process(GatedSource(bm25))
        async with stack:
            return await client.post("/retrieve", content=endless(), headers={"content-type": "application/json"})

    r = asyncio.run(scenario())
    assert r.status_code == 413 and sent <= MAX_BODY + 2 * 1024


# ---------------------------------------------------------------------- start-up errors: one line, exit 2

def _loop_file(tmp_path, content) -> Path:
    (tmp_path / "loop.json").write_text(json.dumps(content))
    return tmp_path / "loop.json"


def start_up_cases(tmp_path) -> dict:
    empty = tmp_path / "empty"
    empty.mkdir()
    return {
        "sample typo": ({"retriever": {"sample": ["hotpotqaa"]}}, [], "unknown sample dataset 'hotpotqaa'"),
        "sample escape": ({"retriever": {"sample": ["../../etc"]}}, [], "unknown sample dataset '../../etc'"),
        "bad index": ({"retriever": {"index": str(empty)}}, [], "is not an effrag index"),
        "bad checkpoint": ({"retriever": {"sample": ["hotpotqa"]}, "method": {
            "name": "efficientrag", "labeler": str(empty), "filter": str(empty)}}, [], "not an effrag model directory"),
        "loop option wrong type": ({"retriever": {"sample": ["hotpotqa"]}, "method": {
            "name": "efficientrag", "labeler": str(empty), "filter": str(empty), "options": {"tag_threshold": "high"}}},
            [], f"{tmp_path / 'serve.yaml'}: method.options.tag_threshold must be a number from 0 to 1, got 'high'"),
        "loop file out of range": ({"retriever": {"sample": ["hotpotqa"]}, "method": {
            "name": "efficientrag", "labeler": str(empty), "filter": str(empty),
            "options": {"config": str(_loop_file(tmp_path, {"config": {"tag_threshold": 7.5}}))}}},
            [], f"{tmp_path / 'loop.json'}: config.tag_threshold must be a number from 0 to 1, got 7.5"),
        "port 99999": (bm25_config(), ["--port", "99999"], "--port: port must be an integer from 0 to 65535"),
        "bad host": (bm25_config(), ["--host", "256.0.0.1"], "cannot listen on 256.0.0.1"),
    }


@pytest.mark.parametrize("case", ["sample typo", "sample escape", "bad index", "bad checkpoint",
                                  "loop option wrong type", "loop file out of range", "port 99999", "bad host",
                                  "port in use"])
def test_start_up_errors_are_one_line(tmp_path, case):
    if case == "port in use":
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config, args, message = bm25_config(), ["--port", str(busy.getsockname()[1])], "Address already in use"
    else:
        busy = None
        config, args, message = start_up_cases(tmp_path)[case]
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    try:
        out = subprocess.run([sys.executable, "-m", "effrag.serve", "--config", str(tmp_path / "serve.yaml"), *args],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    finally:
        if busy is not None:
            busy.close()
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effrag: error: ") and message in lines[0], out.stderr


def test_sample_names_cannot_leave_the_sample_folder(tmp_path):
    from effrag.data import SAMPLE_DIR
    from effrag.serve import bundled_samples, load_config

    assert "hotpotqa" in bundled_samples() and all((SAMPLE_DIR / n / "dev.jsonl").is_file() for n in bundled_samples())
    escape = tmp_path / "outside"
    (escape / "x").mkdir(parents=True)
    (escape / "x" / "dev.jsonl").write_text("{}\n")  # a real file, reachable with ../
    rel = os.path.relpath(escape / "x", SAMPLE_DIR)
    for bad in ("../../etc", rel, "/etc", "hotpotqa/../musique", "", 3):
        with pytest.raises(ValueError, match="retriever.sample: unknown sample dataset"):
            load_config({"retriever": {"sample": [bad]}})
    with pytest.raises(ValueError, match="server.port: port must be an integer from 0 to 65535, got 70000"):
        load_config({"retriever": {"sample": "hotpotqa"}, "server": {"port": 70000}})
    assert load_config({"retriever": {"sample": "musique"}}).retriever.sample == ["musique"]


def test_bad_config_fails_with_a_message(tmp_path):
    from effrag.serve import load_config

    with pytest.raises(ValueError, match=r"serve.yaml: method: unknown key\(s\) topk"):
        (tmp_path / "serve.yaml").write_text("retriever: {sample: hotpotqa}\nmethod: {topk: 3}\n")
        load_config(tmp_path / "serve.yaml")
    with pytest.raises(ValueError, match="needs method.labeler and method.filter"):
        load_config({"retriever": {"sample": "hotpotqa"}, "method": {"name": "efficientrag"}})
    with pytest.raises(ValueError, match="exactly one of sample, corpus, index"):
        load_config({"retriever": {"kind": "bm25"}})
    with pytest.raises(ValueError, match="method.name: unknown method 'nope'; available: .*direct-r"):
        load_config({"retriever": {"sample": "hotpotqa"}, "method": {"name": "nope"}})
    with pytest.raises(ValueError, match="retriever.kind must be bm25, dense or hybrid, got 'tfidf'"):
        load_config({"retriever": {"sample": "hotpotqa", "kind": "tfidf"}})
    with pytest.raises(ValueError, match=r"server.max_batch: expected int, got '8'"):
        load_config({"retriever": {"sample": "hotpotqa"}, "server": {"max_batch": "8"}})
    out = subprocess.run([sys.executable, "-m", "effrag.serve", "--config", str(tmp_path / "missing.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "serve config not found" in out.stderr


# ---------------------------------------------------------------------- EfficientRAG, and /answer with a real LLM

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from test_integrations import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"))


ER_OPTIONS = {"hop_k": 4, "max_hops": 2, "tag_threshold": 0.3}


def efficientrag_config(model_dirs, **server) -> dict:
    cfg = bm25_config(**server)
    cfg["method"] = {"name": "efficientrag", "labeler": str(model_dirs["labeler"]),
                     "filter": str(model_dirs["filter"]), "options": ER_OPTIONS}
    return cfg


def test_efficientrag_server_retrieve_and_thresholds(tmp_path, model_dirs, bm25, questions):
    from effrag.api import EfficientRAG

    rag = EfficientRAG.from_pretrained(model_dirs["labeler"], model_dirs["filter"], retriever=bm25, **ER_OPTIONS)
    with Server(efficientrag_config(model_dirs, batch_window_ms=5), tmp_path) as srv:
        h = httpx.get(srv.url + "/health").json()
        assert h["method"] == "efficientrag" and h["source"]["config"]["tag_threshold"] == 0.3
        assert h["model"]["labeler"] == str(model_dirs["labeler"])
        res = post(srv, "/retrieve", {"questions": questions[:3]}).json()["results"]
        for got, exp in zip(res, rag.retrieve_batch(questions[:3])):
            assert [c["id"] for c in got["chunks"]] == exp.ids
            assert [c["kept_words"] for c in got["chunks"]] == [c.kept_words for c in exp]
            assert [c["hop"] for c in got["chunks"]] == [c.hop for c in exp]
            assert json.loads(json.dumps(exp.trace_json())) == got["trace"]
        assert any(c["kept_words"] for r in res for c in r["chunks"])
        none = post(srv, "/retrieve", {"question": questions[0], "tag_threshold": 1.0}).json()["results"][0]
        all_ = post(srv, "/retrieve", {"question": questions[0], "tag_threshold": 0.0}).json()["results"][0]
        assert none["chunks"] == [] and len(all_["chunks"]) >= 4
        again = post(srv, "/retrieve", {"question": questions[0]}).json()["results"][0]
        assert [c["id"] for c in again["chunks"]] == [c["id"] for c in res[0]["chunks"]]  # thresholds were per request
    assert clean_exit(srv), srv.log


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_memory_levels_off_over_many_requests(tmp_path, model_dirs):
    """An EfficientRAG server (tiny models) answers 5 rounds of 20 requests on distinct questions: after two
    rounds (allocator warm-up) RSS stops growing; nothing per request (traces, results, caches) is kept.
    The real MiniLM checkpoints show the same shape, bigger: docs/reliability.md, "HTTP service"."""
    from effrag.data import load_questions

    qs = [q.question for split in ("train", "dev") for q in load_questions(sample_path("hotpotqa", split))]
    rounds, per_round = 5, 20
    with Server(efficientrag_config(model_dirs, batch_window_ms=1, log_level="warning"), tmp_path) as srv:
        rss, i = [rss_mb(srv.proc.pid)], 0
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            for _ in range(rounds):
                for _ in range(per_round):
                    body = {"questions": [qs[(i + j) % len(qs)] for j in range(3)], "include_trace": i % 2 == 0}
                    assert client.post("/retrieve", json=body).status_code == 200
                    i += 3
                rss.append(rss_mb(srv.proc.pid))
    assert clean_exit(srv) or srv.returncode == 0, srv.log
    growth = [round(b - a, 1) for a, b in zip(rss, rss[1:])]
    print(f"RSS MB after each round of {per_round} requests: {[round(x) for x in rss]}; growth {growth}")
    assert max(rss[3:]) - rss[2] < 8, (rss, growth)  # measured: +70-90 MB, +2-10 MB, then +-1.5 MB


@pytest.mark.llm
def test_answer_with_the_bundled_llm(tmp_path, questions):
    pytest.importorskip("llama_cpp", reason="needs the llm extra (llama-cpp-python + SmolLM2)")
    cfg = bm25_config(batch_window_ms=5)
    cfg["llm"] = {"spec": "default", "dataset": "hotpotqa", "max_tokens": 16, "options": {"cache": False}}
    with Server(cfg, tmp_path) as srv:
        assert httpx.get(srv.url + "/health").json()["answer"] is True
        chunks = post(srv, "/retrieve", {"question": questions[0]}).json()["results"][0]["chunks"]
        a = post(srv, "/answer", {"question": questions[0], "include_trace": False})
        assert a.status_code == 200, a.text
        body = a.json()
        assert isinstance(body["answer"], str) and body["generation"]["completion_tokens"] > 0
        assert body["question"] == questions[0] and [c["id"] for c in body["chunks"]] == [c["id"] for c in chunks]
        assert post(srv, "/answer", {"question": ""}).status_code == 422
    assert clean_exit(srv), srv.log
