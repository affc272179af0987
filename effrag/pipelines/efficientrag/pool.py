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
"""
from __future__ import annotations

import math
from dataclasses import replace

from effrag.text import link_form, link_title

from ..result import Chunk, Result
from .config import EfficientRAGConfig
from .state import LoopState, logit


def rank_pool(s: LoopState, cfg: EfficientRAGConfig) -> Result:
    """One loop state's :class:`Result`: its pool ordered and cut by ``cfg``'s pool options."""
    requery = _requery_scores(s, s.pool + s.rejected)  # empty unless requery_weight recorded later queries
    if cfg.pool_order == "rank":
        ranks = _requery_ranks(s, s.pool + s.rejected)

        def relevance(c: Chunk) -> float:
            conf = c.rank_score if c.rank_score is not None else logit(c.score)
            conf = max(conf, s.rescores.get(c.id, conf))  # read again under a later query (rescore_top)
            later = cfg.requery_weight * math.log1p(ranks[c.id]) if c.id in ranks else 0.0
            return conf - cfg.retrieval_weight * math.log1p(c.retrieval_rank or 0) - later

        scores = {c.id: relevance(c) for c in s.pool + s.rejected}
        if cfg.link_weight or cfg.backlink_weight:
            scores = _with_links(s, s.pool + s.rejected, scores, cfg)
        pool_key = extra_key = lambda c: (-scores[c.id], c.hop)  # noqa: E731
        order = scores
    elif cfg.pool_order in ("fused", "fused_logit"):
        conf = (lambda p: p) if cfg.pool_order == "fused" else logit  # how a p(<Continue>) enters the sum
        later = lambda c: (cfg.requery_weight * requery.get(c.id, 0.0)  # noqa: E731
                           + (cfg.relabel_weight * conf(s.relabels[c.id]) if c.id in s.relabels else 0.0))
        order = {c.id: conf(c.score) + cfg.retrieval_weight * c.retrieval_score + later(c) for c in s.pool + s.rejected}
        pool_key = extra_key = lambda c: (-order[c.id], c.hop)  # noqa: E731
    else:
        pool_key, extra_key = (lambda c: (c.hop, -c.score)), (lambda c: (-c.score, c.hop))
        order = {}
    if cfg.pool_source == "seen":  # one ranking of every labeled chunk; rejected ones flagged
        pool = sorted(s.pool + [replace(c, fallback=True) for c in s.rejected], key=extra_key)
    else:
        pool = sorted(s.pool, key=pool_key)
    if len(pool) < cfg.min_candidates:
        extra = sorted(s.rejected, key=extra_key)[: cfg.min_candidates - len(pool)]
        pool += [replace(c, fallback=True) for c in extra]
    if cfg.max_candidates is not None:
        pool = pool[: cfg.max_candidates]
    if order:  # what the order sorted by, for a reader of the result (the retrieve CLI's score column)
        pool = [replace(c, order_score=float(order[c.id])) for c in pool]
    timing = {k: s.timing.get(k, 0.0) for k in ("retrieval", "labeler", "filter", "other")}
    timing["total"] = sum(timing.values())
    extra = {"requery_scores": {c.id: requery[c.id] for c in pool if c.id in requery}} if cfg.requery_weight else {}
    if cfg.relabel_weight:
        extra["relabel_scores"] = {c.id: s.relabels[c.id] for c in pool if c.id in s.relabels}
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
