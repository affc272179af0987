"""EfficientRAG inference: the LLM-free iterative retrieval loop (paper §3.1, Figure 3).

Hop 0 retrieves the top-``hop_k`` chunks for the question. At every hop the
Labeler reads each (query, chunk) pair once: a chunk tagged <Continue>
(``p_continue >= tag_threshold``) joins the candidate pool and gives its kept
words (``keep prob >= token_threshold``); a <Terminate> chunk ends its branch.
The Filter reads ``"<query> Info: <kept words> Info: ..."`` and its kept words
(``>= filter_threshold``) are the next query. The loop stops when no chunk
continues or after ``max_hops`` retrieval rounds. No LLM is called; the
candidate pool goes to one generator call afterwards (:mod:`.generation`).

Inputs are built exactly as the training data was synthesised, by the same functions
(:func:`effrag.text.chunk_text`, :func:`effrag.text.filter_input_words`).

Many questions run together hop by hop (one Labeler batch, one Filter batch and
one retriever call per distinct ``k`` per hop); every question's result depends
only on its own inputs, so batched and one-at-a-time runs agree.

The loop gives each question a :class:`~.result.Result` whose chunks are the candidate pool
(``score`` = p(<Continue>), ``kept_words`` = the Labeler's) and whose ``trace`` is the per-hop
record; the registered pipeline nests that record under ``"hops"`` beside the answer generation's.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from effrag.text import chunk_text, filter_input_words, join_words, words, words_batch

from .base import Pipeline, register_pipeline
# the loop's options live in their own module; importing them from here keeps working
from .efficientrag_config import (CONTINUE, DEDUP_MODES, POOL_ORDERS, POOL_SOURCES, QUERY_MODES, RANK_QUERIES,
                                  TERMINATE, EfficientRAGConfig, build_config)
from .generation import answer_results
from .result import Chunk, Result

def _logit(p: float, eps: float = 1e-6) -> float:
    p = min(max(p, eps), 1.0 - eps)
    return math.log(p / (1.0 - p))


@dataclass
class _State:
    question: str
    queries: list[str]
    seen: set[str] = field(default_factory=set)
    pool: list[Chunk] = field(default_factory=list)
    rejected: list[Chunk] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    iterations: int = 0
    # requery_weight: each hop >= 1 query's hits ({chunk id: (score, 0-based rank)}) and how many there were
    requeries: list[tuple[dict[str, tuple[float, int]], int]] = field(default_factory=list)
    # relabel_weight: each chunk's best p(<Continue>) under a hop >= 1 query
    relabels: dict[str, float] = field(default_factory=dict)
    # rescore_top: each earlier chunk's best ranker logit under a hop >= 1 query that retrieved it again
    rescores: dict[str, float] = field(default_factory=dict)
    # rank_query "info": each next query's Filter input ("<query> Info: <kept words>"), what the ranker reads
    infos: dict[str, str] = field(default_factory=dict)
    # scratch of the current hop
    entry: dict[str, Any] = field(default_factory=dict)
    cont: list[Chunk] = field(default_factory=list)
    n_pairs: int = 0
    n_relabel: int = 0
    n_jobs: int = 0


class EfficientRAGLoop:
    """The loop over a Labeler, a Filter and any retriever with ``search(queries, k)``."""

    def __init__(self, labeler, filter_model, retriever, config: EfficientRAGConfig | None = None, ranker=None):
        if not callable(getattr(retriever, "search", None)):
            raise TypeError(f"retriever {type(retriever).__name__} has no search(queries, k) method")
        self.labeler = labeler
        self.filter = filter_model
        self.retriever = retriever
        self.ranker = ranker
        self.config = config or EfficientRAGConfig()
        self._words: dict[str, list[str]] = {}
        self._int8: dict[int, tuple[Any, Any]] = {}  # id(model) -> (model, its int8 copy)
        # the models of the current run (int8 copies with config.int8)
        self._lab, self._fil, self._rank = labeler, filter_model, ranker

    # ------------------------------------------------------------------ helpers
    def _search(self, queries: list[str], ks: list[int]) -> list[list[Any]]:
        """One retriever call per distinct ``k`` (so a query's hits never depend on its batch mates)."""
        out: list[list[Any]] = [[] for _ in queries]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, k in enumerate(ks):
            groups[k].append(i)
        for k, idx in sorted(groups.items()):
            hits = self.retriever.search([queries[i] for i in idx], k)
            if len(hits) != len(idx):
                raise RuntimeError(f"retriever returned {len(hits)} hit lists for {len(idx)} queries")
            for i, h in zip(idx, hits):
                out[i] = list(h)
        return out

    def _chunk_words(self, hits: list[Any]) -> list[list[str]]:
        missing = {h.id: chunk_text(h.title, h.text, self.config.chunk_format) for h in hits if h.id not in self._words}
        if missing:
            if len(self._words) > 200_000:
                self._words.clear()
            for cid, ws in zip(missing, words_batch(list(missing.values()))):
                self._words[cid] = ws
        return [self._words[h.id] for h in hits]

    def _model(self, model):
        """``model`` as this run uses it: its int8 copy (made once) with ``config.int8`` on CPU."""
        if not self.config.int8 or not hasattr(model, "parameters"):
            return model
        if id(model) not in self._int8:
            self._int8[id(model)] = (model, int8_copy(model))
        return self._int8[id(model)][1]

    def _prunable(self, s: _State, h: Any) -> bool:
        """At the last hop with ``prune_last_hop``: whether chunk ``h`` cannot enter the capped pool whatever
        the Labeler says (``max_candidates`` pool chunks already outrank its best possible score)."""
        cfg = self.config
        if (cfg.max_candidates is None or cfg.pool_source != "continue" or len(s.pool) < cfg.max_candidates
                or cfg.requery_weight or cfg.relabel_weight  # later queries' scores unknown: nothing exact to prune
                or cfg.pool_order == "rank"):  # a ranker's or the Labeler's score is unknown before it reads
            return False
        if cfg.pool_order == "hop":  # every pool chunk is from an earlier hop
            return True
        best = (lambda c: c.score) if cfg.pool_order == "fused" else (lambda c: _logit(c.score))
        fused = sorted((best(c) + cfg.retrieval_weight * c.retrieval_score for c in s.pool), reverse=True)
        top = (1.0 if cfg.pool_order == "fused" else _logit(1.0)) + cfg.retrieval_weight * float(h.score)
        return top <= fused[cfg.max_candidates - 1]  # ties go to the earlier hop: it stays out

    def _hop_k(self, hop: int) -> int:
        return self.config.first_hop_k if hop == 0 and self.config.first_hop_k else self.config.hop_k

    def _k_for(self, st: _State, qi: int, hop: int) -> int:
        k = self._hop_k(hop)
        if self.config.dedup == "drop":
            return k
        need = k * (qi + 1) + len(st.seen)  # earlier queries of this hop may take up to k each
        return -(-need // k) * k  # round up to a multiple of k: fewer distinct retriever calls

    def _labeler_reads(self, pairs: list, rank_scores: list) -> list[bool]:
        """Which new pairs of the hop the Labeler reads: all, or with ``labeler_top`` each question's
        ``labeler_top`` best by the ranker (ties: the retriever's order)."""
        top = self.config.labeler_top
        if top is None:
            return [True] * len(pairs)
        by_state: dict[int, list[int]] = defaultdict(list)
        for i, (s, _, _, r) in enumerate(pairs):
            by_state[id(s)].append(i)
        read = [False] * len(pairs)
        for idx in by_state.values():
            for i in sorted(idx, key=lambda i: (-rank_scores[i], pairs[i][3]))[:top]:
                read[i] = True
        return read

    # ------------------------------------------------------------------ the loop
    def run(self, questions: Sequence[str]) -> list[Result]:
        """Run the loop for every question together; results in input order.

        Each result's chunks are the candidate pool ranked by ``config.pool_order``, its ``trace`` the
        list of hops, its ``timing`` the loop time split into retrieval / labeler / filter / other / total.
        """
        return self.rank_pools(self.run_states(questions))

    def run_states(self, questions: Sequence[str]) -> list[_State]:
        """The loop without its last step: each question's state (pool, trace, timing) before the pool is ranked.

        :meth:`rank_pools` finishes them; with another config that differs only in the options that act after
        the loop (:data:`~.efficientrag_config.POOL_OPTIONS`), it gives exactly what :meth:`run` would (the tuner
        ranks one loop's states under many pool orders this way).
        """
        import torch

        for i, q in enumerate(questions):
            if not isinstance(q, str) or not q.strip():
                raise ValueError(f"question {i} is empty or not a string: {q!r}")
        cfg = self.config
        if cfg.labeler_top is not None and self.ranker is None:
            raise ValueError("EfficientRAGConfig.labeler_top needs a pool ranker (ranker=...)")
        states = [_State(question=q, queries=[q]) for q in questions]
        self._lab, self._fil = self._model(self.labeler), self._model(self.filter)
        self._rank = self._model(self.ranker) if self.ranker is not None else None
        with torch.inference_mode():
            for hop in range(cfg.max_hops):
                active = [s for s in states if s.queries]
                if not active:
                    break
                self._hop(hop, active)
        return states

    def rank_pools(self, states: Sequence[_State], config: EfficientRAGConfig | None = None) -> list[Result]:
        """Each state's result, its pool ranked and cut by ``config`` (default: the loop's)."""
        return [self._finish(s, config or self.config) for s in states]

    def _hop(self, hop: int, active: list[_State]) -> None:
        cfg, last = self.config, hop + 1 >= self.config.max_hops
        t_hop = time.perf_counter()
        for s in active:
            s.entry = {"hop": hop, "queries": list(s.queries), "retrieved": [], "skipped_seen": 0,
                       "chunks": [], "filter_inputs": [], "next_queries": []}
            s.cont, s.n_pairs, s.n_relabel, s.n_jobs = [], 0, 0, 0
        # 1. retrieval: every query of every active question, one retriever call per distinct k
        reqs = [(s, qi) for s in active for qi in range(len(s.queries))]
        t0 = time.perf_counter()
        hits = self._search([s.queries[qi] for s, qi in reqs], [self._k_for(s, qi, hop) for s, qi in reqs])
        t_ret = time.perf_counter() - t0
        # 2. up to hop_k chunks per query that this question has not seen in any hop
        pairs: list[tuple[_State, int, Any]] = []
        rescore: list[tuple[_State, int, Any]] = []  # (state, query, hit): a seen chunk the ranker reads again
        hop_k = self._hop_k(hop)
        for (s, qi), hs in zip(reqs, hits):
            if hop and hs:  # recorded whatever requery_weight is: it acts after the loop
                reached: dict[str, tuple[float, int]] = {}
                for r, h in enumerate(hs):
                    if h.id not in reached:
                        reached[h.id] = (float(h.score), r)
                s.requeries.append((reached, len(hs)))
            new = []
            for r, h in enumerate(hs):
                if len(new) == hop_k:
                    break
                if h.id in s.seen:
                    s.entry["skipped_seen"] += 1
                    if hop and r < cfg.rescore_top and self._rank is not None:
                        rescore.append((s, qi, h))
                else:
                    s.seen.add(h.id)
                    new.append((r, h))
            if last and cfg.prune_last_hop:  # counted in the trace as "pruned" (only with the option on)
                kept_new = [(r, h) for r, h in new if not self._prunable(s, h)]
                s.entry["pruned"] = s.entry.get("pruned", 0) + len(new) - len(kept_new)
                new = kept_new
            pairs += [(s, qi, h, r) for r, h in new]
            s.n_pairs += len(new)
            s.entry["retrieved"].append([h.id for _, h in new])
        # 3. the Labeler reads all pairs of the hop in one call (with relabel_weight, also every earlier chunk
        #    under this hop's queries: pool order only)
        #    The pool ranker (if any) reads every new pair first; with labeler_top the Labeler reads only each
        #    question's best-ranked new chunks of the hop.
        pair_words = self._chunk_words([h for _, _, h, _ in pairs])
        t0 = time.perf_counter()
        ranked = [(s, qi, h) for s, qi, h, _ in pairs] + rescore
        rank_text = (lambda s, qi: s.infos.get(s.queries[qi], s.queries[qi])) if cfg.rank_query == "info" else \
            (lambda s, qi: s.queries[qi])
        rank_scores = self._rank.predict([rank_text(s, qi) for s, qi, _ in ranked],
                                         pair_words + self._chunk_words([h for _, _, h in rescore]),
                                         batch_size=cfg.batch_size, max_length=cfg.labeler_max_length,
                                         bf16=cfg.bf16) if self._rank is not None and ranked else [None] * len(pairs)
        for (s, qi, h), score in zip(rescore, rank_scores[len(pairs):]):
            s.rescores[h.id] = max(float(score), s.rescores.get(h.id, float("-inf")))
            s.entry.setdefault("rescored", []).append({"id": h.id, "query": qi, "rank_score": round(float(score), 4)})
        rank_scores = rank_scores[:len(pairs)]
        t_rank = time.perf_counter() - t0
        read = self._labeler_reads(pairs, rank_scores)
        relabel = [(s, qi, c) for s in active for qi in range(len(s.queries)) for c in s.pool + s.rejected
                   ] if hop and cfg.relabel_weight else []
        for s, _, _ in relabel:
            s.n_relabel += 1
        to_read = [i for i in range(len(pairs)) if read[i]]
        items = [(pairs[i][0], pairs[i][1], pairs[i][2]) for i in to_read] + relabel
        cwords = [pair_words[i] for i in to_read] + self._chunk_words([c for _, _, c in relabel])
        t0 = time.perf_counter()
        preds = self._lab.predict([s.queries[qi] for s, qi, _ in items], cwords, batch_size=cfg.batch_size,
                                     max_length=cfg.labeler_max_length, bf16=cfg.bf16) if items else []
        t_lab = time.perf_counter() - t0 + t_rank
        for (s, _, c), (p, _) in zip(relabel, preds[len(to_read):]):
            s.relabels[c.id] = max(float(p), s.relabels.get(c.id, 0.0))
        label_of = dict(zip(to_read, preds))
        for i, ((s, qi, h, r), ws, rs) in enumerate(zip(pairs, pair_words, rank_scores)):
            p, probs = label_of.get(i, (None, None))
            if p is not None and hop and cfg.relabel_weight:
                s.relabels[h.id] = max(float(p), s.relabels.get(h.id, 0.0))
            go = p is not None and p >= cfg.tag_threshold
            kept = [w for w, pr in zip(ws, probs) if pr >= cfg.token_threshold] if go else []
            c = Chunk(id=h.id, title=h.title, text=h.text, score=float(p or 0.0), hop=hop, kept_words=kept,
                      query=s.queries[qi], retrieval_score=float(h.score), retrieval_rank=r,
                      rank_score=None if rs is None else float(rs))
            entry = {"id": h.id, "title": h.title, "query": qi,
                     "p_continue": None if p is None else round(float(p), 4),
                     "tag": CONTINUE if go else TERMINATE if p is not None else None, "kept": join_words(kept)}
            if rs is not None:
                entry["rank_score"] = round(float(rs), 4)
            s.entry["chunks"].append(entry)
            (s.pool if go else s.rejected).append(c)
            if go:
                s.cont.append(c)
        # 4. the Filter turns query + kept words into next queries (not after the last hop)
        jobs: list[tuple[_State, str, list[list[str]]]] = []
        full = lambda s: cfg.stop_at_pool is not None and len(s.pool) >= cfg.stop_at_pool  # noqa: E731
        for s in ([] if last else active):
            if full(s):
                continue
            conts = sorted(s.cont, key=lambda c: -c.score)
            if cfg.query_mode == "merged":  # one query per hop: the hop's query + every kept block
                jobs += [(s, s.queries[0], [c.kept_words for c in conts[: cfg.query_chunks]])] if conts else []
            else:  # one query per <Continue> chunk, most confident first
                jobs += [(s, c.query, [c.kept_words]) for c in conts[: cfg.max_branches]]
        finputs = [filter_input_words(base, kept) for _, base, kept in jobs]
        t0 = time.perf_counter()
        fprobs = self._fil.predict(finputs, batch_size=cfg.batch_size, max_length=cfg.filter_max_length,
                                     bf16=cfg.bf16) if jobs else []
        t_fil = time.perf_counter() - t0
        for (s, base, kept), ws, probs in zip(jobs, finputs, fprobs):
            picked = [w for w, pr in zip(ws, probs) if pr >= cfg.filter_threshold]
            if not any(ch.isalnum() for w in picked for ch in w):
                picked = words(base) + [w for k in kept for w in k]  # Filter kept nothing: query + document info
            q = join_words(picked)
            s.n_jobs += 1
            s.entry["filter_inputs"].append(join_words(ws))
            if q not in s.entry["next_queries"]:
                s.entry["next_queries"].append(q)
                s.infos.setdefault(q, join_words(ws))
        # 5. trace, timing shares (by work items; the rest split evenly), next state
        t_rest = max(0.0, time.perf_counter() - t_hop - t_ret - t_lab - t_fil)
        for s in active:
            if not s.cont:
                s.entry["stop"] = "no_continue" if s.n_pairs else "no_new_chunks"
            elif last:
                s.entry["stop"] = "max_hops"
            elif full(s):
                s.entry["stop"] = "pool_full"
            s.timing["retrieval"] += t_ret * len(s.queries) / len(reqs)
            s.timing["labeler"] += t_lab * (s.n_pairs + s.n_relabel) / max(1, len(pairs) + len(relabel))
            s.timing["filter"] += t_fil * s.n_jobs / max(1, len(jobs))
            s.timing["other"] += t_rest / len(active)
            s.trace.append(s.entry)
            s.iterations = hop + 1
            s.queries = s.entry["next_queries"]

    def _finish(self, s: _State, cfg: EfficientRAGConfig) -> Result:
        requery = _requery_scores(s, s.pool + s.rejected)  # empty unless requery_weight recorded later queries
        if cfg.pool_order == "rank":
            ranks = _requery_ranks(s, s.pool + s.rejected)

            def relevance(c: Chunk) -> float:
                conf = c.rank_score if c.rank_score is not None else _logit(c.score)
                conf = max(conf, s.rescores.get(c.id, conf))  # read again under a later query (rescore_top)
                later = cfg.requery_weight * math.log1p(ranks[c.id]) if c.id in ranks else 0.0
                return conf - cfg.retrieval_weight * math.log1p(c.retrieval_rank or 0) - later

            pool_key = extra_key = lambda c: (-relevance(c), c.hop)  # noqa: E731
        elif cfg.pool_order in ("fused", "fused_logit"):
            conf = (lambda p: p) if cfg.pool_order == "fused" else _logit  # how a p(<Continue>) enters the sum
            later = lambda c: (cfg.requery_weight * requery.get(c.id, 0.0)  # noqa: E731
                               + (cfg.relabel_weight * conf(s.relabels[c.id]) if c.id in s.relabels else 0.0))
            pool_key = extra_key = lambda c: (-(conf(c.score) + cfg.retrieval_weight * c.retrieval_score + later(c)),
                                              c.hop)
        else:
            pool_key, extra_key = (lambda c: (c.hop, -c.score)), (lambda c: (-c.score, c.hop))
        if cfg.pool_source == "seen":  # one ranking of every labeled chunk; rejected ones flagged
            pool = sorted(s.pool + [replace(c, fallback=True) for c in s.rejected], key=extra_key)
        else:
            pool = sorted(s.pool, key=pool_key)
        if len(pool) < cfg.min_candidates:
            extra = sorted(s.rejected, key=extra_key)[: cfg.min_candidates - len(pool)]
            pool += [replace(c, fallback=True) for c in extra]
        if cfg.max_candidates is not None:
            pool = pool[: cfg.max_candidates]
        timing = {k: s.timing.get(k, 0.0) for k in ("retrieval", "labeler", "filter", "other")}
        timing["total"] = sum(timing.values())
        extra = {"requery_scores": {c.id: requery[c.id] for c in pool if c.id in requery}} if cfg.requery_weight else {}
        if cfg.relabel_weight:
            extra["relabel_scores"] = {c.id: s.relabels[c.id] for c in pool if c.id in s.relabels}
        return Result(question=s.question, chunks=pool, trace=s.trace, iterations=s.iterations, timing=timing,
                      extra=extra)


def _requery_scores(s: _State, chunks: list[Chunk]) -> dict[str, float]:
    """``requery_weight``: each chunk's best score under the hop >= 1 queries. Their hits hold every chunk
    they reached (refill retrieves past the seen ones); a chunk a query did not reach scores at most that
    query's lowest hit. Empty when the loop stopped at hop 0."""
    if not s.requeries:
        return {}
    floors = [min(v[0] for v in reached.values()) for reached, _ in s.requeries]
    return {c.id: max(reached[c.id][0] if c.id in reached else floor
                      for (reached, _), floor in zip(s.requeries, floors)) for c in chunks}


def _requery_ranks(s: _State, chunks: list[Chunk]) -> dict[str, int]:
    """``pool_order: rank``: each chunk's best 0-based rank under the hop >= 1 queries (a chunk a query did
    not reach ranks at that query's number of hits, a lower bound). Empty when the loop stopped at hop 0."""
    if not s.requeries:
        return {}
    return {c.id: min(reached[c.id][1] if c.id in reached else n for reached, n in s.requeries) for c in chunks}


def int8_copy(model):
    """A copy of ``model`` whose encoder Linear layers run int8 dynamic quantization (``config.int8``).

    Per-channel weights; the heads and the two projections that read the residual stream's outliers
    (``*.output.dense``: attention output and FFN down-projection) stay fp32: quantizing those moved
    p(<Continue>) by up to 0.3 on HotpotQA dev pairs, this keeps it within ~0.06. CPU only: on another
    device (or without PyTorch's fbgemm engine) the model itself is returned, with a warning.
    """
    import copy
    import logging
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    device = next(model.parameters()).device
    if device.type != "cpu" or "fbgemm" not in torch.backends.quantized.supported_engines:
        logging.getLogger(__name__).warning("int8 needs a CPU with the fbgemm engine; running %s as it is", device)
        return model
    q = copy.deepcopy(model)
    spec = {name: per_channel_dynamic_qconfig for name, m in q.encoder.named_modules()
            if isinstance(m, torch.nn.Linear) and not name.endswith("output.dense")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        q.encoder = quantize_dynamic(q.encoder, spec, dtype=torch.qint8)
    return q.eval()


# ---------------------------------------------------------------------- the registered pipeline

_FLAGS = {  # effrag eval flag -> (type, help); dest = config field (except --er-batch-size -> batch_size)
    "--hop-k": (int, "chunks retrieved per query per hop (default 10)"),
    "--first-hop-k": (int, "chunks retrieved for the question at hop 0 (default: --hop-k)"),
    "--max-hops": (int, "retrieval rounds, hop 0 included (default 4)"),
    "--tag-threshold": (float, "p(<Continue>) needed to keep a chunk and go on (default 0.5)"),
    "--token-threshold": (float, "keep probability of a chunk word (default 0.5)"),
    "--filter-threshold": (float, "keep probability of a next-query word (default 0.5)"),
    "--query-mode": (str, "merged: one next query per hop; per_chunk: one per <Continue> chunk"),
    "--dedup": (str, "refill: up to hop-k unseen chunks per query; drop: seen chunks just leave the top hop-k"),
    "--max-branches": (int, "per_chunk mode: next queries per question per hop (default 4)"),
    "--max-candidates": (int, "cap on the candidate pool (default: none)"),
    "--min-candidates": (int, "top up the pool with the likeliest <Terminate> chunks (default 0)"),
    "--pool-order": (str, "hop: earlier hop, then p(<Continue>); fused: p(<Continue>) + weight x retrieval score; "
                    "fused_logit: logit p(<Continue>) + weight x retrieval score; rank: the ranker's logit - "
                    "weight x log(1 + retrieval rank)"),
    "--pool-source": (str, "continue: pool of <Continue> chunks (paper); seen: rank every chunk the Labeler read"),
    "--retrieval-weight": (float, "pool-order fused: weight of the retriever's score (default 1.0)"),
    "--requery-weight": (float, "pool-order fused: weight of a chunk's best score under the later hops' queries "
                         "(default 0: off)"),
    "--relabel-weight": (float, "pool-order fused: weight of a chunk's best p(<Continue>) when the Labeler rereads "
                         "it under a later hop's query (default 0: off)"),
    "--query-chunks": (int, "merged queries: <Continue> chunks (most confident first) whose kept words feed the "
                       "next query (default: all)"),
    "--er-batch-size": (int, "Labeler/Filter forward batch size (default 32)"),
    "--labeler-max-length": (int, "Labeler input length in sub-tokens (default: the trained length)"),
    "--stop-at-pool": (int, "end a question's loop once its pool holds this many <Continue> chunks (default: off)"),
    "--labeler-top": (int, "with --ranker: the Labeler reads only each hop's N best-ranked new chunks (default: all)"),
    "--rescore-top": (int, "with --ranker: it reads again, under a later hop's query, the earlier chunks among that "
                      "query's top N hits (default 0: off)"),
    "--rank-query": (str, "with --ranker: what it reads a later hop's chunks under, the hop's query (query) or the "
                     "Filter's input, query + Info: kept words (info)"),
}


def load_models(labeler, filter_model, device: str | None = None, ranker=None):
    """Labeler and Filter (and, when given, the pool ranker) from checkpoint directories, on ``device``
    (default: CUDA when present). Models given as objects pass through where they are. Returns
    ``(labeler, filter)``, or ``(labeler, filter, ranker)`` when ``ranker`` is given."""
    import torch

    from effrag.models import FilterModel, LabelerModel, RankerModel

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = lambda m: isinstance(m, str) or hasattr(m, "__fspath__")  # noqa: E731
    if path(labeler):
        labeler = LabelerModel.from_pretrained(labeler).to(device)
    if path(filter_model):
        filter_model = FilterModel.from_pretrained(filter_model).to(device)
    if ranker is None:
        return labeler.eval(), filter_model.eval()
    if path(ranker):
        ranker = RankerModel.from_pretrained(ranker).to(device)
    return labeler.eval(), filter_model.eval(), ranker.eval()


loop_config = property(lambda self: self.loop.config, lambda self, cfg: setattr(self.loop, "config", cfg),
                       doc="The loop's options (assigning a new config changes the loop's); shared by every "
                           "object that wraps an :class:`EfficientRAGLoop` as ``self.loop``.")


@register_pipeline("efficientrag", aliases=("efficient-rag",))
class EfficientRAGPipeline(Pipeline):
    """EfficientRAG retrieval, plus one generator call per question when ``generator`` is given.

    The models come from a system (``model``: a folder or a shipped name, :mod:`.efficientrag_system`; the
    shipped ``efficientrag-all`` when neither ``model`` nor ``labeler``/``filter`` is given) or from
    checkpoint folders (``labeler``, ``filter``, ``ranker``). The result's chunks are the candidate pool
    (what the paper's Recall@K counts); ``trace`` is ``{"hops": [...], "generation": ...}``, ``timing``
    the loop time split into retrieval / labeler / filter / other (and generation). ``config`` or
    ``er_config`` (a JSON file; a system's ``loop.json`` by default) give the loop options; keyword options
    (the ``effrag eval`` flags) override them. ``k`` (``effrag eval --k``) sets ``hop_k`` only when given:
    a config file's ``hop_k`` is not silently replaced by the CLI's default. The pool ranker runs when the
    config orders the pool by it (``pool_order: rank``).
    """

    k_in_config = True
    uses_generator = True

    def __init__(self, retriever, labeler=None, filter=None, config=None, generator=None,
                 k: int | None = None, er_config: str | None = None, er_batch_size: int | None = None,
                 er_bf16: bool | None = None, ranker=None, model=None, **options: Any):
        named = ranker is not None
        labeler, filter, ranker, config = self._resolve(model, labeler, filter, ranker, config or er_config)
        config = self._config(config, k, er_batch_size, er_bf16, **options)
        if not named and config.pool_order != "rank" and config.labeler_top is None:
            ranker = None  # a system's own ranker only reads when the config ranks by it
        models = load_models(labeler, filter, ranker=ranker)
        self.loop = EfficientRAGLoop(models[0], models[1], retriever, config,
                                     ranker=models[2] if ranker is not None else None)
        self.generator = generator

    @staticmethod
    def _resolve(model, labeler, filter, ranker, config):
        """``(labeler, filter, ranker, config)``: from the system ``model`` when no checkpoint is named."""
        from .efficientrag_system import DEFAULT_SYSTEM, open_system

        if labeler is None and filter is None:
            system = open_system(model or DEFAULT_SYSTEM, config if isinstance(config, (str, Path)) else None)
            return system.labeler, system.filter, ranker or system.ranker, config or system.config
        if model is not None:
            raise ValueError("give --model (a system) or --labeler/--filter (checkpoints), not both")
        if labeler is None or filter is None:
            raise ValueError("efficientrag needs both --labeler DIR and --filter DIR (or --model, a system folder)")
        return labeler, filter, ranker, config

    @staticmethod
    def _config(config, k, er_batch_size, er_bf16, **options: Any) -> EfficientRAGConfig:
        if k is not None and options.get("hop_k") is None:
            options["hop_k"] = k
        options.setdefault("bf16", er_bf16)
        return build_config(config, batch_size=er_batch_size, **options)

    @classmethod
    def check_options(cls, labeler=None, filter=None, config=None, k=None, er_config=None, er_batch_size=None,
                      er_bf16=None, ranker=None, model=None, **options: Any) -> None:
        _, _, ranker, config = cls._resolve(model, labeler, filter, ranker, config or er_config)
        if cls._config(config, k, er_batch_size, er_bf16, **options).labeler_top is not None and ranker is None:
            raise ValueError("labeler_top needs a pool ranker (--ranker DIR, or a system folder with ranker/)")

    @classmethod
    def default_retriever(cls, labeler=None, filter=None, config=None, er_config=None, model=None,
                          **options: Any) -> str | None:
        """The retriever the loop config was tuned for (``effrag eval`` builds it when ``--retriever`` is not given)."""
        from .efficientrag_system import config_retriever

        config = cls._resolve(model, labeler, filter, None, config or er_config)[3]
        return config_retriever(config) if isinstance(config, (str, Path)) else None

    config = loop_config

    @classmethod
    def add_args(cls, parser) -> None:
        g = parser.add_argument_group("efficientrag")
        g.add_argument("--model", metavar="DIR|NAME", help="an EfficientRAG system: a folder with labeler/, filter/, "
                       "[ranker/], loop.json (what the recipe writes) or a shipped name (default efficientrag-all "
                       "when no --labeler is given); its loop.json and that config's retriever are the defaults")
        g.add_argument("--labeler", metavar="DIR", help="trained Labeler checkpoint directory")
        g.add_argument("--filter", metavar="DIR", help="trained Filter checkpoint directory")
        g.add_argument("--ranker", metavar="DIR", help="trained pool ranker checkpoint directory (pool_order rank)")
        g.add_argument("--er-config", metavar="JSON", help="loop config file (e.g. a system's loop-<dataset>.json)")
        for flag, (typ, help_) in _FLAGS.items():
            choices = {"--query-mode": QUERY_MODES, "--dedup": DEDUP_MODES, "--pool-order": POOL_ORDERS,
                       "--pool-source": POOL_SOURCES, "--rank-query": RANK_QUERIES}.get(flag)
            g.add_argument(flag, type=typ, default=None, choices=choices, help=help_)
        g.add_argument("--er-int8", dest="int8", action="store_true", default=None,
                       help="int8 dynamic quantization of the Labeler/Filter Linear layers (CPU)")
        g.add_argument("--prune-last-hop", action="store_true", default=None,
                       help="skip last-hop chunks that cannot enter the capped pool (exact)")
        g.add_argument("--er-bf16", action="store_true", default=None, help="bf16 autocast for Labeler/Filter (fp32 on CPUs without native bf16)")

    def run(self, question: str) -> Result:
        return self.run_batch([question])[0]

    def run_batch(self, questions: list[str]) -> list[Result]:
        return with_answers(self.loop.run(list(questions)), self.generator)


def with_answers(results: list[Result], generator: Any = None) -> list[Result]:
    """Loop results as the registered pipeline returns them (in place): answered by ``generator`` when
    given (:func:`.generation.answer_results`), the per-hop trace under ``"hops"`` beside the
    generator's under ``"generation"``, and the generation time in ``timing``."""
    for r, reply in zip(results, answer_results(generator, results)):
        r.trace = {"hops": r.trace, **({"generation": reply["trace"]} if reply.get("trace") else {})}
        if "latency_s" in reply:
            r.timing["generation"] = reply["latency_s"]
    return results
