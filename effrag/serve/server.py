"""``effrag serve``: the command line and the uvicorn server that drains on SIGTERM and exits 0."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading

from .app import Lifecycle, create_app
from .config import LOG_LEVELS, ServeConfig, check_port, load_config
from .service import Service, build_service

log = logging.getLogger("effrag.serve")



# ---------------------------------------------------------------------------- command line
def add_serve_parser(sub) -> None:
    """``effrag serve``: hooked into effrag/cli.py's SUBCOMMANDS as ``effrag.serve:add_serve_parser``."""
    p = sub.add_parser("serve", help="HTTP retrieval service: POST /retrieve, /answer; GET /health, /openapi.json")
    p.add_argument("--config", required=True, metavar="FILE", help="serve config YAML (see configs/serve.yaml)")
    p.add_argument("--host", help="bind address (default: the config's, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port, 0-65535; 0 picks a free one (default: the config's, 8080)")
    p.add_argument("--log-level", choices=LOG_LEVELS)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args) -> None:
    cfg = load_config(args.config)
    if getattr(args, "port", None) is not None:
        check_port(args.port, "--port")
    for key in ("host", "port", "log_level"):
        if getattr(args, key, None) is not None:
            setattr(cfg.server, key, getattr(args, key))
    serve(cfg)


def _listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; a bad host or a port in use is a one-line ValueError."""
    check_port(port, "port")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart while old conns linger
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _server_class():
    """uvicorn.Server that drains before it shuts down and does not re-raise the signal it handled."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, lifecycle: Lifecycle, drain_s: float):
            super().__init__(config)
            self.lifecycle, self.drain_s = lifecycle, drain_s

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn.Server raises the captured SIGTERM/SIGINT again once it has shut down, so a clean
            # shutdown exits 143 (or 130); here a completed shutdown returns normally: exit code 0
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        async def shutdown(self, sockets=None) -> None:
            # Drain: keep serving for up to drain_s, every response with Connection: close, so keep-alive
            # clients close their connections after their next answer; only then stop listening and close
            # the connections still idle (uvicorn closes idle ones at once: a request sent on one at that
            # moment gets a reset). Ends early once no connection is left.
            self.lifecycle.draining = True
            loop = asyncio.get_running_loop()
            end = loop.time() + self.drain_s
            conns = self.server_state.connections
            log.info("shutting down: draining %d connection(s) for up to %.1f s", len(conns), self.drain_s)
            while conns and not self.force_exit and loop.time() < end:
                await asyncio.sleep(0.02)
            await super().shutdown(sockets=sockets)

    return DrainingServer


def serve(cfg: ServeConfig, service: Service | None = None) -> None:
    """Load the service, then run uvicorn until SIGINT/SIGTERM; drains, and returns normally (exit code 0).

    Start-up errors (config, sample names, index or checkpoint folders, host and port) raise
    ValueError/OSError before anything listens, for the CLI's one-line ``effrag: error: ...``.
    """
    import uvicorn

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(cfg.server.log_level.upper())
    s = cfg.server
    _listen_socket(s.host, s.port).close()  # a bad host or a port in use fails now, not after the models load
    svc = service or build_service(cfg)
    sock = _listen_socket(s.host, s.port)
    try:
        app = create_app(cfg, service=svc)
        config = uvicorn.Config(app, log_level=s.log_level, lifespan="on",
                                timeout_graceful_shutdown=s.graceful_timeout_s)
        server = _server_class()(config, app.state.lifecycle, s.drain_s)
        host, port = sock.getsockname()[:2]
        log.info("effrag serve listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
        server.run(sockets=[sock])
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m effrag.serve --config FILE`` (the same as ``effrag serve``, errors included)."""
    from effrag.cli import main as cli_main

    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])
