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
    """Uvicorn re-raises the SIGTERM it handled once shutdown is complete, so -SIGTERM is a clean exit too."""
    return srv.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in srv.log \
        and "effrag serve stopped" in srv.log


def bm25_config(**server) -> dict:
    return {"retriever": {"kind": "bm25", "sample": ["hotpotqa"]}, "method": {"name": "direct-r", "k": 5},
            "server": {"max_batch": MAX_BATCH, "max_top_k": 20, "max_question_chars": 300, "batch_window_ms": 50,
                       "log_level": "info", **server}}


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
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/retrieve", "/answer", "/health"} <= set(spec["paths"])
    docs = httpx.get(server.url + "/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_retrieve_single_and_batch_match_the_retriever(server, bm25, questions):
    r = post(server, "/retrieve", {"question": questions[0]})
    assert r.status_code == 200
    res = r.json()["results"]
    assert len(res) == 1 and res[0]["question"] == questions[0]
    hits = bm25.search([questions[0]], 5)[0]
    assert [c["id"] for c in res[0]["chunks"]] == [h.id for h in hits]
    assert [c["title"] for c in res[0]["chunks"]] == [h.title for h in hits]
    assert res[0]["trace"][0]["retrieved"] == [h.id for h in hits]
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
    r = post(server, "/answer", {"question": "Who?"})
    assert r.status_code == 501 and "no LLM configured" in r.json()["error"]


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
            assert json.loads(json.dumps(exp.trace)) == got["trace"]
        assert any(c["kept_words"] for r in res for c in r["chunks"])
        none = post(srv, "/retrieve", {"question": questions[0], "tag_threshold": 1.0}).json()["results"][0]
        all_ = post(srv, "/retrieve", {"question": questions[0], "tag_threshold": 0.0}).json()["results"][0]
        assert none["chunks"] == [] and len(all_["chunks"]) >= 4
        again = post(srv, "/retrieve", {"question": questions[0]}).json()["results"][0]
        assert [c["id"] for c in again["chunks"]] == [c["id"] for c in res[0]["chunks"]]  # thresholds were per request
    assert clean_exit(srv), srv.log


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
