"""The HTTP service under test (``effrag serve`` on a free loopback port) and its small configs, shared by
tests/serve/test_serve.py and tests/serve/test_serve_startup.py (a test file never imports another test file).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# -- the HTTP service (effrag serve) ---------------------------------------------------------------------------
SERVE_MAX_BATCH = 8
SERVE_MAX_BODY = 16384


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m effrag.serve --config FILE`` on a free loopback port; SIGTERM on exit."""

    def __init__(self, config: dict, tmp: Path):
        import yaml

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg_path, self.log_path = tmp / "serve.yaml", tmp / "serve.log"
        self.cfg_path.write_text(yaml.safe_dump(config))
        self.returncode: int | None = None

    def __enter__(self) -> Server:
        import httpx

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
        import signal

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
    """A Direct-R BM25 service over the bundled HotpotQA sample, with small limits the tests reach."""
    return {"retriever": {"kind": "bm25", "sample": ["hotpotqa"]}, "method": {"name": "direct-r", "k": 5},
            "server": {"max_batch": SERVE_MAX_BATCH, "max_top_k": 20, "max_question_chars": 300, "batch_window_ms": 50,
                       "max_body_bytes": SERVE_MAX_BODY, "log_level": "info", **server}}


def post(srv, path, body, **kw):
    """A JSON POST to a running :class:`Server`."""
    import httpx

    return httpx.post(srv.url + path, json=body, timeout=60, **kw)
