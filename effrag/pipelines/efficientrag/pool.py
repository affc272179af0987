"""EfficientRAG's candidate pool after the loop: which chunks a question gets, in which order.

Every option here acts on a finished loop (:data:`~.config.POOL_OPTIONS`), so the tuner ranks
one loop run under all of them (:meth:`~.loop.EfficientRAGLoop.rank_pools`). Its input is the loop's public
:class:`~.state.LoopState`.

``pool_order: rank`` scores a chunk by the pool ranker's best logit minus ``retrieval_weight`` x log(1 + its
rank in its query's hits) minus ``requery_weight`` x log(1 + its best rank under a later query), then adds the
link bonus: ``link_weight`` when the chunk's title is named in the text of one of the ``link_top`` best chunks
(the second paragraph of a bridge question is the entity the first one names: Wikipedia's hyperlink), and
``backlink_weight`` when the chunk's own text names one of their titles. Titles are matched as whole words,
case-folded, without a trailing "(disambiguation)" (:func:`effrag.text.link_title`). Nothing here reads a
retriever's raw score, so one config carries across retrievers and corpus sizes.

``set_ranker_top: N`` then hands the order's first N candidates to a set-wise model (:mod:`effrag.models.set_ranker`,
a system's ``set-ranker/``), which scores them together from what the loop knows of each (:func:`_record`): the
link bonus becomes one input among others, and a score can depend on the other candidates.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

from effrag.text import link_form, link_title

from ..result import Chunk, Result
from .config import EfficientRAGConfig
from .state import LoopState, logit


def rank_pool(s: LoopState, cfg: EfficientRAGConfig, set_ranker=None) -> Result:
    """One loop state's :class:`Result`: its pool ordered and cut by ``cfg``'s pool options. ``set_ranker``: the
    set-wise model that reorders the order's first ``cfg.set_ranker_top`` candidates (:func:`set_order`)."""
    requery = _requery_scores(s, s.pool + s.rejected)  # empty unless requery_weight recorded later queries
    plain: dict[str, float] = {}
    ranks: dict[str, int] = {}
    if cfg.pool_order == "rank":
        ranks = _requery_ranks(s, s.pool + s.rejected)

        def relevance(c: Chunk) -> float:
            conf = c.rank_score if c.rank_score is not None else logit(c.score)
            conf = max(conf, s.rescores.get(c.id, conf))  # read again under a later query (rescore_top)
            later = cfg.requery_weight * math.log1p(ranks[c.id]) if c.id in ranks else 0.0
            return conf - cfg.retrieval_weight * math.log1p(c.retrieval_rank or 0) - later

        scores = plain = {c.id: relevance(c) for c in s.pool + s.rejected}
        if cfg.link_weight or cfg.backlink_weight:
            scores = _with_links(s, s.pool + s.rejected, scores, cfg)
        pool_key = extra_key = lambda c: (-scores[c.id], c.hop)  # noqa: E731
        order = scores
    elif cfg.pool_order in ("fused", "fused_logit"):
        conf = (lambda p: p) if cfg.pool_order == "fused" else logit  # how a p(<Continue>) enters the sum
        later = lambda c: cfg.requery_weight * requery.get(c.id, 0.0)  # noqa: E731
        order = {c.id: conf(c.score) + cfg.retrieval_weight * c.retrieval_score + later(c) for c in s.pool + s.rejected}
        pool_key = extra_key = lambda c: (-order[c.id], c.hop)  # noqa: E731
    else:
        pool_key, extra_key = (lambda c: (c.hop, -c.score)), (lambda c: (-c.score, c.hop))
        order = {}
    if cfg.pool_source == "seen":  # one ranking of every labeled chunk; rejected ones flagged
        pool = sorted(s.pool + [replace(c, fallback=True) for c in s.rejected], key=extra_key)
    else:
        pool = sorted(s.pool, key=pool_key)
    set_seconds = 0.0
    if cfg.set_ranker_top:
        t0 = time.perf_counter()
        if set_ranker is None:
            raise ValueError("EfficientRAGConfig.set_ranker_top needs a set-wise pool ranker (a system's set-ranker/)")
        pool = set_order(s, pool, [_record(s, c, plain, order, ranks) for c in pool[: cfg.set_ranker_top]],
                         set_ranker)
        set_seconds = time.perf_counter() - t0
    if len(pool) < cfg.min_candidates:
        extra = sorted(s.rejected, key=extra_key)[: cfg.min_candidates - len(pool)]
        pool += [replace(c, fallback=True) for c in extra]
    if cfg.max_candidates is not None:
        pool = pool[: cfg.max_candidates]
    if order:  # what the order sorted by, for a reader of the result (the retrieve CLI's score column)
        pool = [replace(c, order_score=float(order[c.id])) for c in pool]
    timing = {k: s.timing.get(k, 0.0) for k in ("retrieval", "labeler", "filter", "other")}
    timing["other"] += set_seconds
    timing["total"] = sum(timing.values())
    extra = {"requery_scores": {c.id: requery[c.id] for c in pool if c.id in requery}} if cfg.requery_weight else {}
    return Result(question=s.question, chunks=pool, hops=s.trace, iterations=s.iterations, timing=timing,
                  extra=extra)


def _with_links(s: LoopState, chunks: list[Chunk], scores: dict[str, float],
                cfg: EfficientRAGConfig) -> dict[str, float]:
    """``scores`` plus the link bonuses (module docstring) against the ``link_top`` best-scored chunks. Each
    chunk's linkable forms are computed once per loop state (the tuner ranks one state under many configs)."""
    forms: dict[str, tuple[str, str]] = s.link_forms
    for c in chunks:
        if c.id not in forms:
            forms[c.id] = (link_title(c.title), link_form(c.text))
    top = sorted(chunks, key=lambda c: (-scores[c.id], c.hop))[: cfg.link_top]
    out = dict(scores)
    for c in chunks:
        name, text = forms[c.id]
        others = [forms[t.id] for t in top if t.id != c.id]
        if cfg.link_weight and name and any(f" {name} " in t_text for _, t_text in others):
            out[c.id] += cfg.link_weight
        if cfg.backlink_weight and any(t_name and f" {t_name} " in text for t_name, _ in others):
            out[c.id] += cfg.backlink_weight
    return out


def _requery_scores(s: LoopState, chunks: list[Chunk]) -> dict[str, float]:
    """``requery_weight``: each chunk's best score under the hop >= 1 queries. Their hits hold every chunk
    they reached (refill retrieves past the seen ones); a chunk a query did not reach scores at most that
    query's lowest hit. Empty when the loop stopped at hop 0."""
    if not s.requeries:
        return {}
    floors = [min(v[0] for v in reached.values()) for reached, _ in s.requeries]
    return {c.id: max(reached[c.id][0] if c.id in reached else floor
                      for (reached, _), floor in zip(s.requeries, floors)) for c in chunks}


def _requery_ranks(s: LoopState, chunks: list[Chunk]) -> dict[str, int]:
    """``pool_order: rank``: each chunk's best 0-based rank under the hop >= 1 queries (a chunk a query did
    not reach ranks at that query's number of hits, a lower bound). Empty when the loop stopped at hop 0."""
    if not s.requeries:
        return {}
    return {c.id: min(reached[c.id][1] if c.id in reached else n for reached, n in s.requeries) for c in chunks}


def set_order(s: LoopState, pool: list[Chunk], records: list[dict], set_ranker) -> list[Chunk]:
    """``pool`` with its first ``len(records)`` chunks in ``set_ranker``'s order (they are scored together, each
    score reading the others; :mod:`effrag.models.set_ranker`), the rest as they were."""
    if len(records) < 2:
        return pool
    queries = [q for e in s.trace for q in e.get("next_queries", [])]
    scores = set_ranker.predict(s.question, queries, records)
    head = [pool[i] for i in sorted(range(len(records)), key=lambda i: (-scores[i], i))]
    return head + pool[len(records):]


def _record(s: LoopState, c: Chunk, plain: dict[str, float], linked: dict[str, float], ranks: dict[str, int]) -> dict:
    """What a set-wise ranker reads of one candidate: the pool order's score with (``linked``) and without
    (``plain``) the link terms, the pool ranker's best logit, the Labeler's, retrieval and requery ranks."""
    conf = c.rank_score if c.rank_score is not None else logit(c.score)
    return {"id": c.id, "title": c.title, "text": c.text, "hop": c.hop, "rejected": c.fallback,
            "labeler": logit(c.score), "ranker": max(conf, s.rescores.get(c.id, conf)),
            "retrieval_rank": c.retrieval_rank, "requery_rank": ranks.get(c.id),
            "linked": float(linked.get(c.id, 0.0)), "plain": float(plain.get(c.id, linked.get(c.id, 0.0)))}


def pool_candidates(s: LoopState, cfg: EfficientRAGConfig, top: int) -> list[dict]:
    """The ``top`` first candidates of ``cfg``'s pool order (before any set-wise step), as the records a set-wise
    pool ranker reads (:func:`_record`): its training data."""
    cfg = replace(cfg, max_candidates=None, set_ranker_top=0)
    full = rank_pool(s, cfg)
    plain = rank_pool(s, replace(cfg, link_weight=0.0, backlink_weight=0.0))
    plain_score = {c.id: c.order_score for c in plain.chunks if c.order_score is not None}
    linked = {c.id: c.order_score for c in full.chunks if c.order_score is not None}
    ranks = _requery_ranks(s, s.pool + s.rejected)
    return [_record(s, c, plain_score, linked, ranks) for c in full.chunks[:top]]
