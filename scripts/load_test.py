#!/usr/bin/env python
"""Bounded load test of ``effrag serve`` on loopback: N concurrent clients for T seconds against /retrieve.

    # start a server from a config, test it, stop it
    python scripts/load_test.py --spawn --config configs/serve.yaml --clients 8 --duration 20 --out runs/load_test
    # or test a server that is already running on this machine
    python scripts/load_test.py --url http://127.0.0.1:8080 --clients 8 --duration 20

Only loopback targets (127.0.0.0/8, ::1, localhost) are accepted. Each client sends
one request at a time, questions taken round-robin from a dataset file; the run stops
after ``--duration`` seconds or ``--max-requests`` requests, whichever comes first.
Reports requests/s, questions/s, latency p50/p95/p99, errors, and the server's
batching counters (how many requests shared a model call), as JSON and markdown;
with ``--spawn`` also the server's RSS before and after the load (Linux), to check that
memory levels off: run it twice with different ``--max-requests`` and compare.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from effrag.cli_args import DATASETS, add_limit_arg, add_output_arg, add_questions_arg, add_source_args
from effrag.evaluation.report import md_table
from effrag.provenance import portable, provenance, report_source


def loopback_only(url: str) -> str:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"load_test: refusing non-loopback target {url!r}: use 127.0.0.1, ::1 or localhost")
    return url.rstrip("/")


def percentile(sorted_xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_xs:
        return None
    rank = max(1, int(-(-p * len(sorted_xs) // 100)))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


def load_question_texts(path: str, limit: int) -> list[str]:
    from effrag.data import load_questions

    qs = [q.question for q in load_questions(path)][:limit]
    if not qs:
        raise SystemExit(f"load_test: no questions in {path}")
    return qs


def spawn_server(config: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "effrag.serve", "--config", config, "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"load_test: server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise SystemExit(f"load_test: server did not come up in 300 s; see {log_path}")


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return round(next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return None


def stop_server(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


async def run_clients(url: str, questions: list[str], args) -> dict:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent, end = 0, 0.0

    async def client(cid: int, http: httpx.AsyncClient) -> None:
        nonlocal sent
        i = cid * args.batch
        while time.perf_counter() < end and sent < args.max_requests:
            sent += 1
            batch = [questions[(i + j) % len(questions)] for j in range(args.batch)]
            i += args.batch * args.clients
            body = {"question": batch[0]} if args.batch == 1 else {"questions": batch}
            body.update({"top_k": args.top_k} if args.top_k else {}, include_trace=False)
            t0 = time.perf_counter()
            try:
                r = await http.post("/retrieve", json=body)
                if r.status_code == 200 and len(r.json()["results"]) == len(batch):
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors[f"http_{r.status_code}"] = errors.get(f"http_{r.status_code}", 0) + 1
            except httpx.HTTPError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as http:
        before = (await http.get("/health")).json()
        t0 = time.perf_counter()
        end = t0 + args.duration
        await asyncio.gather(*(client(c, http) for c in range(args.clients)))
        elapsed = time.perf_counter() - t0
        after = (await http.get("/health")).json()
    lat = sorted(latencies)
    ms = lambda x: None if x is None else round(1000 * x, 2)  # noqa: E731
    b0, b1 = before.get("batching", {}), after.get("batching", {})
    batches = b1.get("batches", 0) - b0.get("batches", 0)
    served = b1.get("questions", 0) - b0.get("questions", 0)
    return {
        "clients": args.clients, "duration_s": round(elapsed, 3), "requests": len(lat) + sum(errors.values()),
        "ok": len(lat), "errors": sum(errors.values()), "errors_by_kind": errors,
        "questions_per_request": args.batch, "requests_per_s": round(len(lat) / elapsed, 2),
        "questions_per_s": round(len(lat) * args.batch / elapsed, 2),
        "latency_ms": {"p50": ms(percentile(lat, 50)), "p95": ms(percentile(lat, 95)), "p99": ms(percentile(lat, 99)),
                       "mean": ms(sum(lat) / len(lat)) if lat else None, "max": ms(lat[-1] if lat else None)},
        "server": {"method": after.get("method"), "retriever": after.get("retriever"),
                   "corpus_size": after.get("corpus_size"), "model_calls": batches,
                   "mean_questions_per_model_call": round(served / batches, 2) if batches else None,
                   "largest_batch": b1.get("largest_batch")},
    }


def markdown(report: dict) -> str:
    lat, srv = report["latency_ms"], report["server"]
    rows = [("target", report["url"]), ("method / retriever", f"{srv['method']} / {srv['retriever']}"),
            ("corpus passages", srv["corpus_size"]), ("clients", report["clients"]),
            ("questions per request", report["questions_per_request"]), ("duration s", report["duration_s"]),
            ("requests ok / errors", f"{report['ok']} / {report['errors']}"),
            ("requests/s", report["requests_per_s"]), ("questions/s", report["questions_per_s"]),
            ("latency p50 / p95 / p99 ms", f"{lat['p50']} / {lat['p95']} / {lat['p99']}"),
            ("latency mean / max ms", f"{lat['mean']} / {lat['max']}"),
            ("model calls (mean questions per call)", f"{srv['model_calls']} ({srv['mean_questions_per_model_call']})")]
    rss = report.get("server_rss_mb") or {}
    if rss.get("before") is not None:
        rows.append(("server RSS MB before / after", f"{rss['before']} / {rss['after']}"))
    # f"{v}": a value the server did not report reads "None", as it always has
    return ("# effrag serve load test\n\n" + md_table(["", ""], [(k, f"{v}") for k, v in rows], "lr")
            + f"\nCommand: `{report['command']}`\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server on loopback, e.g. http://127.0.0.1:8080")
    target.add_argument("--spawn", action="store_true", help="start `effrag serve --config` on a free loopback port")
    p.add_argument("--config", help="serve config for --spawn (default configs/serve.yaml)", default="configs/serve.yaml")
    add_questions_arg(p, required=False, help="dataset file (default: the bundled HotpotQA dev sample)")
    add_limit_arg(p, 1000, help="use at most this many questions")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load (at most 600)")
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1, help="questions per request")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    add_output_arg(p, "runs/load_test", dest="out", help="folder for load_test.json / load_test.md")
    add_source_args(p)
    args = p.parse_args(argv)
    if not (1 <= args.clients <= 256 and 0 < args.duration <= 600 and args.batch >= 1 and args.max_requests >= 1):
        raise SystemExit("load_test: need 1 <= clients <= 256, 0 < duration <= 600, batch >= 1, max-requests >= 1")
    commit = report_source(args.out, args.allow_dirty)
    if args.questions is None:
        from effrag.data import sample_path

        args.questions = str(sample_path(DATASETS[0], "dev"))  # HotpotQA's
    url = None if args.spawn else loopback_only(args.url)
    questions = load_question_texts(args.questions, args.limit)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    if args.spawn:
        proc, url = spawn_server(args.config, out / "server.log")
    rss_before = rss_mb(proc.pid) if proc is not None else None
    try:
        report = asyncio.run(run_clients(url, questions, args))
        rss_after = rss_mb(proc.pid) if proc is not None else None
    finally:
        code = stop_server(proc) if proc is not None else None
    report.update(url=url, questions_file=args.questions, server_exit_code=code,
                  server_rss_mb={"before": rss_before, "after": rss_after},
                  **provenance(argv=argv, prog="python scripts/load_test.py", files=[args.questions], commit=commit),
                  started=time.strftime("%Y-%m-%dT%H:%M:%S"), config=args.config if args.spawn else None)
    (out / "load_test.json").write_text(json.dumps(portable(report), indent=2))
    (out / "load_test.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'load_test.json'} and {out / 'load_test.md'}")
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
