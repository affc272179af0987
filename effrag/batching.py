"""Micro-batching for the HTTP service: concurrent requests become one model call.

Kept apart from :mod:`effrag.serve` because it is plain asyncio (no FastAPI) and is
useful to any server that wraps a batched ``retrieve_batch``.
"""
import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

class Unavailable(RuntimeError):
    """The service is shutting down or its queue is full (HTTP 503)."""


@dataclass
class _Job:
    questions: list[str]
    key: tuple
    future: asyncio.Future


class MicroBatcher:
    """Gather concurrent requests into one ``fn(questions, top_k=..., **options)`` call per option set.

    One worker task pulls jobs from an asyncio queue, waits up to ``window_s`` for
    more (until ``max_batch`` questions), and runs each group of jobs with equal
    options in a single-thread executor, so model calls never overlap. A failing
    group is retried job by job, so one bad request cannot fail its batch mates.
    """

    def __init__(self, fn: Callable[..., list], max_batch: int = 32, window_s: float = 0.005, max_queue: int = 1024):
        self.fn, self.max_batch, self.window_s = fn, max_batch, window_s
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=max_queue)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effrag-model")
        self.stats = {"requests": 0, "questions": 0, "batches": 0, "largest_batch": 0}
        self._closing = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def submit(self, questions: list[str], top_k: int | None = None, **options: Any) -> list:
        if self._closing:
            raise Unavailable("the service is shutting down")
        fut = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(_Job(list(questions), (top_k, tuple(sorted(options.items()))), fut))
        except asyncio.QueueFull:
            raise Unavailable(f"too many pending requests ({self.queue.maxsize}); retry later") from None
        return await fut

    async def close(self) -> int:
        """Stop taking requests, finish every queued one, stop the worker; returns how many were drained."""
        self._closing = True
        pending = self.queue.qsize()
        if self._task is not None:
            await self.queue.put(None)  # FIFO: the worker reaches it after every queued job
            await self._task
        self.executor.shutdown(wait=True)
        return pending

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self.queue.get()
            if job is None:
                return
            batch, n, stop = [job], len(job.questions), False
            deadline = loop.time() + self.window_s
            while n < self.max_batch and (left := deadline - loop.time()) > 0:
                try:
                    nxt = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                n += len(nxt.questions)
            groups: dict[tuple, list[_Job]] = {}
            for j in batch:
                groups.setdefault(j.key, []).append(j)
            for key, jobs in groups.items():
                await self._run_group(loop, key, jobs)
            if stop:
                return

    async def _run_group(self, loop, key: tuple, jobs: list[_Job]) -> None:
        top_k, options = key[0], dict(key[1])
        questions = [q for j in jobs for q in j.questions]
        try:
            results = await loop.run_in_executor(self.executor, lambda: self.fn(questions, top_k=top_k, **options))
        except Exception as e:  # noqa: BLE001 - handed to the requests
            if len(jobs) > 1:
                for j in jobs:
                    await self._run_group(loop, key, [j])
                return
            results, error = None, e
        self.stats["batches"] += 1
        self.stats["requests"] += len(jobs)
        self.stats["questions"] += len(questions)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(questions))
        start = 0
        for j in jobs:
            if not j.future.done():  # the client may have gone away
                if results is None:
                    j.future.set_exception(error)
                else:
                    j.future.set_result(results[start:start + len(j.questions)])
            start += len(j.questions)
