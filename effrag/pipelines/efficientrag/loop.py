"""EfficientRAG inference: the LLM-free iterative retrieval loop (paper §3.1, Figure 3).

Hop 0 retrieves the top-``hop_k`` chunks for the question. At every hop the
Labeler reads each (query, chunk) pair once: a chunk tagged <Continue>
(``p_continue >= tag_threshold``) joins the candidate pool and gives its kept
words (``keep prob >= token_threshold``); a <Terminate> chunk ends its branch.
The Filter reads ``"<query> Info: <kept words> Info: ..."`` and its kept words
(``>= filter_threshold``) are the next query. The loop stops when no chunk
continues or after ``max_hops`` retrieval rounds. No LLM is called; the
candidate pool goes to one generator call afterwards (:mod:`effrag.pipelines.generation`).

Inputs are built exactly as the training data was synthesised, by the same functions
(:func:`effrag.text.chunk_text`, :func:`effrag.text.filter_input_words`).

Many questions run together hop by hop (one Labeler batch, one Filter batch and
one retriever call per distinct ``k`` per hop); every question's result depends
only on its own inputs, so batched and one-at-a-time runs agree. A hop is five named
steps (:meth:`EfficientRAGLoop._hop`): retrieve, keep the new chunks, read them (pool
ranker, then Labeler), write the next queries (Filter), record.

The loop gives each question a :class:`~.state.LoopState`; :func:`~.pool.rank_pool` turns it into a
:class:`~effrag.pipelines.result.Result` whose chunks are the candidate pool (``score`` = p(<Continue>),
``kept_words`` = the Labeler's) and whose ``hops`` are the per-hop records. The registered pipeline, which
is also the public ``effrag.EfficientRAG``, is :mod:`.pipeline`.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effrag.text import chunk_text, filter_input_words, join_words, words, words_batch

from ..result import Chunk, Result
from .config import CONTINUE, TERMINATE, EfficientRAGConfig
from .models import int8_copy
from .pool import rank_pool
from .state import LoopState


@dataclass
class _Step:
    """One question's work in the hop under way (what lasts goes to its :class:`LoopState`)."""

    state: LoopState
    entry: dict[str, Any]  # the hop's trace record, appended to state.trace when the hop ends
    cont: list[Chunk] = field(default_factory=list)  # the hop's <Continue> chunks
    n_pairs: int = 0  # new chunks read (timing shares)
    n_jobs: int = 0  # Filter inputs


# (a question's step, its query's index, the hit, the hit's 0-based rank in that query's hits)
_Pair = tuple[_Step, int, Any, int]
# chunks EfficientRAGLoop.prepare splits and tokenises ahead of the questions (about 8 KB of resident
# memory each on HotpotQA, spaCy's lexicon included)
PREPARED_CHUNKS = 200_000


class EfficientRAGLoop:
    """The loop over a Labeler, a Filter and any retriever with ``search(queries, k)``."""

    def __init__(self, labeler, filter_model, retriever, config: EfficientRAGConfig | None = None, ranker=None,
                 words: dict[tuple[str, str], tuple[str, ...]] | None = None, set_ranker=None):
        if not callable(getattr(retriever, "search", None)):
            raise TypeError(f"retriever {type(retriever).__name__} has no search(queries, k) method")
        self.labeler = labeler
        self.filter = filter_model
        self.retriever = retriever
        self.ranker = ranker
        self.set_ranker = set_ranker  # set_ranker_top: reorders the pool's first N together (effrag.models.set_ranker)
        self.config = config or EfficientRAGConfig()
        # (chunk_format, chunk id) -> the chunk's words; ``words`` shares another loop's over the same corpus (a
        # prepared one, see prepare)
        self._words: dict[tuple[str, str], tuple[str, ...]] = {} if words is None else words
        self._int8: dict[int, tuple[Any, Any]] = {}  # id(model) -> (model, its int8 copy)
        # the models of the current run (int8 copies with config.int8)
        self._lab, self._fil, self._rank = labeler, filter_model, ranker

    # ------------------------------------------------------------------ the loop
    def run(self, questions: Sequence[str]) -> list[Result]:
        """Run the loop for every question together; results in input order.

        Each result's chunks are the candidate pool ranked by ``config.pool_order``, its ``trace`` the
        list of hops, its ``timing`` the loop time split into retrieval / labeler / filter / other / total.
        """
        return self.rank_pools(self.run_states(questions))

    def run_states(self, questions: Sequence[str]) -> list[LoopState]:
        """The loop without its last step: each question's :class:`LoopState` before its pool is ranked.

        :meth:`rank_pools` finishes them; with another config that differs only in the options that act after
        the loop (:data:`~.config.POOL_OPTIONS`), it gives exactly what :meth:`run` would (the tuner ranks one
        loop's states under many pool orders this way).
        """
        import torch

        for i, q in enumerate(questions):
            if not isinstance(q, str) or not q.strip():
                raise ValueError(f"question {i} is empty or not a string: {q!r}")
        cfg = self.config
        if cfg.needs_ranker() and self.ranker is None:
            raise ValueError(f"EfficientRAGConfig.{cfg.needs_ranker()} needs a pool ranker (ranker=...)")
        if cfg.set_ranker_top and self.set_ranker is None:
            raise ValueError("EfficientRAGConfig.set_ranker_top needs a set-wise pool ranker (set_ranker=...)")
        states = [LoopState(question=q, queries=[q]) for q in questions]
        self._lab, self._fil = self._model(self.labeler), self._model(self.filter)
        self._rank = self._model(self.ranker) if self.ranker is not None else None
        with torch.inference_mode():
            for hop in range(cfg.max_hops):
                active = [s for s in states if s.queries]
                if not active:
                    break
                self._hop(hop, active)
        return states

    def rank_pools(self, states: Sequence[LoopState], config: EfficientRAGConfig | None = None) -> list[Result]:
        """Each state's result, its pool ranked and cut by ``config`` (default: the loop's)."""
        return [rank_pool(s, config or self.config, self.set_ranker) for s in states]

    def _hop(self, hop: int, active: list[LoopState]) -> None:
        """One round for every question still going, in five steps (batched across questions)."""
        t_hop = time.perf_counter()
        steps = [_Step(s, {"hop": hop, "queries": list(s.queries), "retrieved": [], "skipped_seen": 0,
                           "chunks": [], "filter_inputs": [], "next_queries": []}) for s in active]
        reqs, hits, t_ret = self._retrieve(hop, steps)  # 1. every query, one retriever call per distinct k
        pairs, rescore = self._new_chunks(hop, reqs, hits)  # 2. the chunks no earlier hop read
        pair_words = self._chunk_words([h for _, _, h, _ in pairs])
        rank_scores, t_rank = self._rank_pairs(pairs, pair_words, rescore)  # 3a. the pool ranker reads
        n_labeled, t_lab = self._label(hop, steps, pairs, pair_words, rank_scores)  # 3b. the Labeler reads
        n_jobs, t_fil = self._write_queries(hop, steps)  # 4. the Filter writes the next queries
        # 5. trace, timing shares (by work items; the rest split evenly), next queries
        t_lab += t_rank
        t_rest = max(0.0, time.perf_counter() - t_hop - t_ret - t_lab - t_fil)
        for w in steps:
            self._record(hop, w, t_ret * len(w.state.queries) / len(reqs),
                         t_lab * w.n_pairs / max(1, n_labeled),
                         t_fil * w.n_jobs / max(1, n_jobs), t_rest / len(steps))

    # ------------------------------------------------------------------ the steps of a hop
    def _retrieve(self, hop: int, steps: list[_Step]) -> tuple[list[tuple[_Step, int]], list[list[Any]], float]:
        """Step 1: every query of every question still going, one retriever call per distinct ``k``."""
        reqs = [(w, qi) for w in steps for qi in range(len(w.state.queries))]
        t0 = time.perf_counter()
        hits = self._search([w.state.queries[qi] for w, qi in reqs],
                            [self._k_for(w.state, qi, hop) for w, qi in reqs])
        return reqs, hits, time.perf_counter() - t0

    def _new_chunks(self, hop: int, reqs: list[tuple[_Step, int]], hits: list[list[Any]]
                    ) -> tuple[list[_Pair], list[tuple[_Step, int, Any]]]:
        """Step 2: up to ``hop_k`` chunks per query that the question has not seen in any hop (the pairs to
        read), and with ``rescore_top`` the seen chunks a later query retrieves again (the ranker reads them)."""
        cfg = self.config
        pairs: list[_Pair] = []
        rescore: list[tuple[_Step, int, Any]] = []
        hop_k = self._hop_k(hop)
        for (w, qi), hs in zip(reqs, hits):
            s = w.state
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
                    w.entry["skipped_seen"] += 1
                    if hop and r < cfg.rescore_top and self._rank is not None:
                        rescore.append((w, qi, h))
                else:
                    s.seen.add(h.id)
                    new.append((r, h))
            pairs += [(w, qi, h, r) for r, h in new]
            w.n_pairs += len(new)
            w.entry["retrieved"].append([h.id for _, h in new])
        return pairs, rescore

    def _rank_pairs(self, pairs: list[_Pair], pair_words: list[tuple[str, ...]], rescore: list[tuple[_Step, int, Any]]
                    ) -> tuple[list[float | None], float]:
        """Step 3a: the pool ranker (if any) reads every new pair, and the seen chunks to rescore (their best
        logit goes to ``state.rescores``). Returns the new pairs' scores (None without a ranker) and the time."""
        cfg = self.config
        if self._rank is None or not (pairs or rescore):
            return [None] * len(pairs), 0.0
        t0 = time.perf_counter()
        ranked = [(w, qi, h) for w, qi, h, _ in pairs] + rescore
        query = (lambda s, qi: s.infos.get(s.queries[qi], s.queries[qi])) if cfg.rank_query == "info" else \
            (lambda s, qi: s.queries[qi])
        scores = self._rank.predict([query(w.state, qi) for w, qi, _ in ranked],
                                    pair_words + self._chunk_words([h for _, _, h in rescore]),
                                    batch_size=cfg.batch_size, bf16=cfg.bf16,
                                    max_length=self._ranker_length())
        for (w, qi, h), score in zip(rescore, scores[len(pairs):]):
            w.state.rescores[h.id] = max(float(score), w.state.rescores.get(h.id, float("-inf")))
            w.entry.setdefault("rescored", []).append({"id": h.id, "query": qi, "rank_score": round(float(score), 4)})
        return scores[:len(pairs)], time.perf_counter() - t0

    def _label(self, hop: int, steps: list[_Step], pairs: list[_Pair], pair_words: list[tuple[str, ...]],
               rank_scores: list[float | None]) -> tuple[int, float]:
        """Step 3b: the Labeler reads the hop's pairs in one call (with ``labeler_top`` only each question's
        best-ranked ones); each read pair joins the pool (<Continue>) or is rejected. Returns the pairs the
        Labeler's time is shared by and its time."""
        cfg = self.config
        read = self._labeler_reads(hop, pairs, rank_scores)
        to_read = [i for i in range(len(pairs)) if read[i]]
        items = [pairs[i][:3] for i in to_read]
        cwords = [pair_words[i] for i in to_read]
        t0 = time.perf_counter()
        preds = self._lab.predict([w.state.queries[qi] for w, qi, _ in items], cwords, batch_size=cfg.batch_size,
                                  max_length=cfg.labeler_max_length, bf16=cfg.bf16) if items else []
        t_lab = time.perf_counter() - t0
        label_of = dict(zip(to_read, preds))
        for i, ((w, qi, h, r), ws, rs) in enumerate(zip(pairs, pair_words, rank_scores)):
            self._admit(hop, w, qi, h, r, ws, rs, *label_of.get(i, (None, None)))
        return len(pairs), t_lab

    def _admit(self, hop: int, w: _Step, qi: int, h: Any, r: int, ws: list[str], rs: float | None,
               p: float | None, probs: Any) -> None:
        """One new pair into the pool (tagged <Continue>, with its kept words) or the rejected chunks, and its
        trace row (``p_continue`` None: the Labeler did not read it)."""
        cfg, s = self.config, w.state
        go = p is not None and p >= cfg.tag_threshold
        kept = [x for x, pr in zip(ws, probs) if pr >= cfg.token_threshold] if go else []
        c = Chunk(id=h.id, title=h.title, text=h.text, score=float(p or 0.0), hop=hop, kept_words=kept,
                  query=s.queries[qi], retrieval_score=float(h.score), retrieval_rank=r,
                  rank_score=None if rs is None else float(rs))
        entry = {"id": h.id, "title": h.title, "query": qi, "p_continue": None if p is None else round(float(p), 4),
                 "tag": CONTINUE if go else TERMINATE if p is not None else None, "kept": join_words(kept)}
        if rs is not None:
            entry["rank_score"] = round(float(rs), 4)
        w.entry["chunks"].append(entry)
        (s.pool if go else s.rejected).append(c)
        if go:
            w.cont.append(c)

    def _write_queries(self, hop: int, steps: list[_Step]) -> tuple[int, float]:
        """Step 4: the Filter turns each question's query + kept words into its next queries (not after the last
        hop). Returns the number of Filter inputs and the Filter's time."""
        cfg = self.config
        if hop + 1 >= cfg.max_hops:
            return 0, 0.0
        jobs: list[tuple[_Step, str, list[list[str]]]] = []
        for w in steps:
            conts = sorted(w.cont, key=lambda c: -c.score)
            if cfg.query_mode == "merged":  # one query per hop: the hop's query + every kept block
                jobs += [(w, w.state.queries[0], [c.kept_words for c in conts[: cfg.query_chunks]])] if conts else []
            else:  # one query per <Continue> chunk, most confident first
                jobs += [(w, c.query, [c.kept_words]) for c in conts[: cfg.max_branches]]
        finputs = [filter_input_words(base, kept) for _, base, kept in jobs]
        t0 = time.perf_counter()
        fprobs = self._fil.predict(finputs, batch_size=cfg.batch_size, max_length=cfg.filter_max_length,
                                   bf16=cfg.bf16) if jobs else []
        t_fil = time.perf_counter() - t0
        for (w, base, kept), ws, probs in zip(jobs, finputs, fprobs):
            picked = [x for x, pr in zip(ws, probs) if pr >= cfg.filter_threshold]
            if not any(ch.isalnum() for x in picked for ch in x):
                picked = words(base) + [x for k in kept for x in k]  # Filter kept nothing: query + document info
            q = join_words(picked)
            w.n_jobs += 1
            w.entry["filter_inputs"].append(join_words(ws))
            if q not in w.entry["next_queries"]:
                w.entry["next_queries"].append(q)
                w.state.infos.setdefault(q, join_words(ws))
        return len(jobs), t_fil

    def _record(self, hop: int, w: _Step, t_ret: float, t_lab: float, t_fil: float, t_rest: float) -> None:
        """Step 5: the hop's trace record (and why this question stops, if it does), its timing, its next queries."""
        s, last = w.state, hop + 1 >= self.config.max_hops
        if not w.cont and not (last and w.n_pairs and not self.config.label_last_hop):  # not tagged: max_hops
            w.entry["stop"] = "no_continue" if w.n_pairs else "no_new_chunks"
        elif last:
            w.entry["stop"] = "max_hops"
        s.timing["retrieval"] += t_ret
        s.timing["labeler"] += t_lab
        s.timing["filter"] += t_fil
        s.timing["other"] += t_rest
        s.trace.append(w.entry)
        s.iterations = hop + 1
        s.queries = w.entry["next_queries"]

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

    def prepare(self, passages: Sequence[Any] | None = None, batch_size: int = 1024,
                vector_store: str | Path | None = None) -> dict[str, float]:
        """Split and tokenise the chunks of ``passages`` (default: the retriever's ``corpus``) before any question:
        the index-time half of reading, so the questions' reads cost only the models (the words the Labeler labels
        and the sub-tokens of the pair models, :mod:`effrag.models.pair_encoding`). A late-interaction ranker's
        chunk vectors are made here too: loaded from ``vector_store`` (a folder, :mod:`effrag.models.late_vectors`)
        where it holds them, else encoded and added to it. Up to :data:`PREPARED_CHUNKS` passages. A retriever's
        corpus larger than that is not split here (which part the questions read is unknown), and nothing of it is
        encoded: the ranker reads the store on demand, each chunk a question reads from its memory map, so a large
        corpus costs a question what a small one does once its vectors are built (``effrag index build --system``);
        a chunk the store lacks is encoded when first read. Without a corpus it does nothing. Returns the passages
        prepared, the seconds it took and the chunk vectors ``vectors_loaded`` and ``vectors_encoded``, and with a
        store past the cap, ``vectors_stored`` (the chunks the store holds)."""
        t0 = time.perf_counter()
        rank = self._model(self.ranker) if self.ranker is not None else None
        if passages is None:
            passages = getattr(self.retriever, "corpus", None)
            if not hasattr(passages, "__len__") or len(passages) > PREPARED_CHUNKS:  # which part is read is unknown:
                passages = None  # each chunk is split when a question first reads it, as without prepare
                if vector_store is not None and hasattr(rank, "attach_store"):  # ... and its vectors read on demand
                    store = rank.vector_store(vector_store, self.config.bf16, self._ranker_length())
                    rank.attach_store(store, self._ranker_length(), self.config.bf16)
                    return {"passages": 0, "vectors_loaded": 0, "vectors_encoded": 0,
                            "vectors_stored": store.refresh(), "seconds": time.perf_counter() - t0}
        passages = list(passages or [])[:PREPARED_CHUNKS]
        from effrag.models.pair_encoding import pair_encoder

        encoders = {id(e): e for m in (self.labeler, self.ranker) if getattr(m, "tokenizer", None) is not None
                    for e in [pair_encoder(m.tokenizer)] if e.fast}
        words: list[tuple[str, ...]] = []
        for i in range(0, len(passages), batch_size):
            ws = self._chunk_words(passages[i: i + batch_size])
            for e in encoders.values():
                e.chunk_tokens(ws)
            words.extend(ws)
        out = {"passages": len(passages), "vectors_loaded": 0, "vectors_encoded": 0}
        # a late-interaction ranker: each chunk's vectors, read once here by the model the questions read with
        # (its int8 copy with config.int8)
        if words and hasattr(rank, "index"):
            cfg = self.config
            store = None if vector_store is None else rank.vector_store(vector_store, cfg.bf16, self._ranker_length())
            from tqdm.auto import tqdm

            with tqdm(total=len(words), desc="late-interaction chunk vectors", unit="chunk", mininterval=5,
                      disable=len(words) < 2048, leave=False) as bar:
                made = rank.index(words, batch_size=cfg.batch_size, bf16=cfg.bf16, max_length=self._ranker_length(),
                                  store=store, progress=bar.update)
            out.update(vectors_loaded=made["loaded"], vectors_encoded=made["encoded"])
        return {**out, "seconds": time.perf_counter() - t0}

    def _ranker_length(self) -> int | None:
        """The ranker's input length as the loop reads with it (None: its trained one); prepare reads at the same."""
        return self.config.ranker_max_length or self.config.labeler_max_length

    def _chunk_words(self, hits: list[Any]) -> list[tuple[str, ...]]:
        fmt = self.config.chunk_format  # part of the key: a request (or rag.config) may read chunks as text only
        missing = {(fmt, h.id): chunk_text(h.title, h.text, fmt) for h in hits if (fmt, h.id) not in self._words}
        if missing:
            if len(self._words) > 2 * PREPARED_CHUNKS:  # a prepared corpus plus as many chunks from elsewhere
                self._words.clear()
            for key, ws in zip(missing, words_batch(list(missing.values()))):
                # a tuple of interned words: one string per distinct word, and the very tuple the pair models' cache
                # keys the chunk's sub-tokens by (effrag.models.pair_encoding), so it is held once
                self._words[key] = tuple(sys.intern(w) for w in ws)
        return [self._words[(fmt, h.id)] for h in hits]

    def _model(self, model):
        """``model`` as this run uses it: its int8 copy (made once) with ``config.int8`` on CPU."""
        if not self.config.int8 or not hasattr(model, "parameters"):
            return model
        if id(model) not in self._int8:
            self._int8[id(model)] = (model, int8_copy(model))
        return self._int8[id(model)][1]

    def _hop_k(self, hop: int) -> int:
        return self.config.first_hop_k if hop == 0 and self.config.first_hop_k else self.config.hop_k

    def _k_for(self, st: LoopState, qi: int, hop: int) -> int:
        k = self._hop_k(hop)
        if self.config.dedup == "drop":
            return k
        need = k * (qi + 1) + len(st.seen)  # earlier queries of this hop may take up to k each
        return -(-need // k) * k  # round up to a multiple of k: fewer distinct retriever calls

    def _labeler_reads(self, hop: int, pairs: list[_Pair], rank_scores: list[float | None]) -> list[bool]:
        """Which new pairs of the hop the Labeler reads: all, or with ``labeler_top`` each question's
        ``labeler_top`` best by the ranker (ties: the retriever's order); none at the last hop without
        ``label_last_hop``."""
        top = self.config.labeler_top
        if hop + 1 >= self.config.max_hops and not self.config.label_last_hop:
            return [False] * len(pairs)  # nothing reads the last hop's tags (config.label_last_hop)
        if top is None:
            return [True] * len(pairs)
        by_question: dict[int, list[int]] = defaultdict(list)
        for i, (w, _, _, r) in enumerate(pairs):
            by_question[id(w)].append(i)
        read = [False] * len(pairs)
        for idx in by_question.values():
            for i in sorted(idx, key=lambda i: (-rank_scores[i], pairs[i][3]))[:top]:
                read[i] = True
        return read
