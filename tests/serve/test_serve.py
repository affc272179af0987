"""``effrag serve``: the real server in a subprocess on 127.0.0.1, called over HTTP with httpx.

BM25 Direct-R over the bundled HotpotQA sample for the endpoint, validation, concurrency and shutdown tests
(the server: tests/helpers.py ``Server``); start-up errors and the EfficientRAG service are in
test_serve_startup.py.
"""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest
from serve_helpers import SERVE_MAX_BATCH, SERVE_MAX_BODY, Server, bm25_config, clean_exit, post

from effrag.data import build_corpus, sample_path

QUESTIONS_FILE = sample_path("hotpotqa", "dev")
MAX_BATCH, MAX_BODY = SERVE_MAX_BATCH, SERVE_MAX_BODY


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
    ({"question": "a", "tag_threshold": 0.4}, 400, "method direct-r takes no tag_threshold (its per-request options: "
                                                   "none)"),
    ({"question": "a", "include_trace": "yes"}, 422, "include_trace: Input should be a valid boolean"),
    # the schema is the served method's (Pipeline.request_rules): another method's option is a 400 naming it
    ({"question": "a", "link_weight": 3, "max_hops": 2}, 400, "method direct-r takes no link_weight, max_hops"),
    ({"question": "a", "max_hops": 2, "qustion": "b"}, 422, "qustion: Extra inputs are not permitted"),
    ({"question": "a", "batch_size": 4}, 422, "batch_size: Extra inputs are not permitted"),  # no method's request
])
def test_bad_requests_get_clear_errors(server, body, status, message):
    r = post(server, "/retrieve", body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_the_openapi_schema_is_the_served_methods(server):
    spec = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    fields = set(spec["RetrieveRequest"]["properties"])
    assert fields == {"question", "questions", "top_k", "include_trace"}  # direct-r: no per-request options


@pytest.mark.parametrize("body, message", [
    ({"tag_threshold": 1.5}, "tag_threshold: Input should be less than or equal to 1"),
    ({"link_weight": -1}, "link_weight: Input should be greater than or equal to 0"),
    ({"max_hops": "2"}, "max_hops: Input should be a valid integer"),
    ({"pool_order": "best"}, "pool_order: Input should be 'hop', 'fused', 'fused_logit' or 'rank'"),
    ({"batch_size": 4}, "batch_size: Extra inputs are not permitted"),  # runtime: fixed at start-up
])
def test_an_efficientrag_request_schema_has_each_loop_options_own_rule(body, message):
    """EfficientRAG's request schema: every loop and pool option with the loop's own rule (its request_rules), the
    runtime ones left out. Checked on the request model the app builds (a served EfficientRAG: test_serve_startup)."""
    import pydantic

    from effrag.pipelines.efficientrag.config import OPTION_GROUPS
    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline
    from effrag.serve.app import _request_models
    from effrag.serve.config import ServerSection

    retrieve_request, _ = _request_models(ServerSection(), EfficientRAGPipeline.request_rules())
    assert set(OPTION_GROUPS["loop"]) | set(OPTION_GROUPS["pool"]) <= set(retrieve_request.model_fields)
    assert not set(OPTION_GROUPS["runtime"]) & set(retrieve_request.model_fields)
    assert retrieve_request(question="a", tag_threshold=0.4, pool_order="rank").tag_threshold == 0.4
    with pytest.raises(pydantic.ValidationError) as e:
        retrieve_request(question="a", **body)
    err = e.value.errors()[0]
    assert f"{err['loc'][-1]}: {err['msg']}" == message


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
