"""What the loop knows of one question when its hops end: the input of the candidate pool (:mod:`.pool`).

The loop (:mod:`.loop`) fills a :class:`LoopState` per question; :func:`.pool.rank_pool` orders and cuts its pool
under any config that differs only in the options acting after the loop (``POOL_OPTIONS``), so the tuner ranks one
loop run under many pool orders. Nothing in it refers to a hop in progress: that scratch is the loop's own.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..result import Chunk


def logit(p: float, eps: float = 1e-6) -> float:
    """The clipped log-odds of a p(<Continue>): how the Labeler's confidence enters a sum with other scores."""
    p = min(max(p, eps), 1.0 - eps)
    return math.log(p / (1.0 - p))


@dataclass
class LoopState:
    """One question's loop: its queries, every chunk read and what was learnt of it, the trace and timing."""

    question: str
    queries: list[str]  # the next hop's queries (empty: the loop ended for this question)
    seen: set[str] = field(default_factory=set)  # every chunk id read in any hop (never read twice)
    pool: list[Chunk] = field(default_factory=list)  # tagged <Continue>
    rejected: list[Chunk] = field(default_factory=list)  # tagged <Terminate>, or not read by the Labeler
    trace: list[dict[str, Any]] = field(default_factory=list)  # one record per hop (Result.hops)
    timing: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    iterations: int = 0
    # requery_weight: each hop >= 1 query's hits ({chunk id: (score, 0-based rank)}) and how many there were
    requeries: list[tuple[dict[str, tuple[float, int]], int]] = field(default_factory=list)
    # rescore_top: each earlier chunk's best ranker logit under a hop >= 1 query that retrieved it again
    rescores: dict[str, float] = field(default_factory=dict)
    # rank_query "info": each next query's Filter input ("<query> Info: <kept words>"), what the ranker reads
    infos: dict[str, str] = field(default_factory=dict)
    # link_weight / backlink_weight: each chunk's (title, text) in the form titles are looked up in (a cache)
    link_forms: dict[str, tuple[str, str]] = field(default_factory=dict)
