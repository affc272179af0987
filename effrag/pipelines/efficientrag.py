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
(``score`` = p(<Continue>), ``kept_words`` = the Labeler's) and whose ``hops`` are the per-hop
records (:class:`~.result.Hop`). The registered pipeline, which is also the public ``effrag.EfficientRAG``,
is :mod:`.efficientrag_pipeline`.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from effrag.text import chunk_text, filter_input_words, join_words, words, words_batch

# the loop's options live in their own module; importing them from here keeps working
from .efficientrag_config import (CONTINUE, DEDUP_MODES, POOL_ORDERS, POOL_SOURCES, QUERY_MODES,  # noqa: F401
                                  RANK_QUERIES, TERMINATE, EfficientRAGConfig, build_config)
from .efficientrag_pool import _logit, rank_pool
from .result import Chunk, Result

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
    # link_weight / backlink_weight: each chunk's (title, text) in the form titles are looked up in
    link_forms: dict[str, tuple[str, str]] = field(default_factory=dict)
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
                                         batch_size=cfg.batch_size,
                                         max_length=cfg.ranker_max_length or cfg.labeler_max_length,
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
        return rank_pool(s, cfg)


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
