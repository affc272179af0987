"""Micro-batching for the HTTP service: concurrent requests become one model call.

Kept apart from :mod:`effrag.serve` because it is plain asyncio (no FastAPI) and is
useful to any server that wraps a batched ``retrieve_batch``.
"""
import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("effrag.batching")


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

    :meth:`counts` says how many requests wait for a model call (``queued``: in the
    queue or gathered in the batch window) and how many are in the call running now
    (``in_model``). :meth:`close` answers every queued request before it returns; a
    request is never left without an answer, even if the worker itself fails.
    """

    def __init__(self, fn: Callable[..., list], max_batch: int = 32, window_s: float = 0.005, max_queue: int = 1024):
        self.fn, self.max_batch, self.window_s = fn, max_batch, window_s
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=max_queue)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effrag-model")
        self.stats = {"requests": 0, "questions": 0, "batches": 0, "largest_batch": 0}
        self._closing = False
        self._task: asyncio.Task | None = None
        self._waiting = 0  # submitted, not yet handed to fn (queue + batch window)
        self._in_model = 0  # in the group that fn is running now

    @property
    def closing(self) -> bool:
        return self._closing

    def counts(self) -> dict[str, int]:
        """``{"queued": requests waiting for a model call, "in_model": requests in the running call}``."""
        return {"queued": self._waiting, "in_model": self._in_model}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def submit(self, questions: list[str], top_k: int | None = None, **options: Any) -> list:
        if self._closing:
            raise Unavailable("the service is shutting down")
        if self._task is not None and self._task.done():
            raise Unavailable("the batching worker has stopped")
        fut = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(_Job(list(questions), (top_k, tuple(sorted(options.items()))), fut))
        except asyncio.QueueFull:
            raise Unavailable(f"too many pending requests ({self.queue.maxsize}); retry later") from None
        self._waiting += 1
        return await fut

    async def close(self) -> int:
        """Stop taking requests, finish every queued one, stop the worker; returns how many were drained."""
        self._closing = True
        pending = self._waiting
        if self._task is not None and not self._task.done():
            await self.queue.put(None)  # FIFO: the worker reaches it after every queued job
            await asyncio.wait([self._task])
        self._fail_queued(Unavailable("the service stopped before this request was run"))
        self.executor.shutdown(wait=True)
        return pending

    def _fail_queued(self, error: Exception) -> None:
        """Answer whatever is still queued (only if the worker stopped early)."""
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if job is not None:
                self._waiting -= 1
                if not job.future.done():
                    job.future.set_exception(error)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        try:
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
                    self._waiting -= len(jobs)
                    self._in_model = len(jobs)
                    try:
                        await self._run_group(loop, key, [j for j in jobs if not j.future.done()])
                    except Exception as e:  # noqa: BLE001 - a bug here must not leave requests unanswered
                        log.exception("batch failed")
                        for j in jobs:
                            if not j.future.done():
                                j.future.set_exception(e)
                    finally:
                        self._in_model = 0
                if stop:
                    return
        finally:
            if not self._closing:
                log.error("the batching worker stopped; queued requests get 503")
            self._fail_queued(Unavailable("the batching worker stopped"))

    async def _run_group(self, loop, key: tuple, jobs: list[_Job]) -> None:
        if not jobs:  # every client of this group went away before its turn
            return
        top_k, options = key[0], dict(key[1])
        questions = [q for j in jobs for q in j.questions]
        try:
            results = await loop.run_in_executor(self.executor, lambda: self.fn(questions, top_k=top_k, **options))
            if len(results) != len(questions):
                raise RuntimeError(f"retrieve_batch returned {len(results)} results for {len(questions)} questions")
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
