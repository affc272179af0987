"""IRRR inference (Qi et al., 2021, section 3.1): retrieve, read, rerank, repeat.

The reasoning path starts as the question. Each step:

1. the query head picks words of the path (probability >= ``query_threshold``) and
   they are sent to the retriever; the top ``k`` new paragraphs are the candidates;
2. the reader reads every path + candidate: the answerability (log-likelihood ratio,
   Appendix C) of the best one is compared with ``answer_threshold`` and, if it
   passes, its answer is returned and the loop stops;
3. otherwise the reranker's top candidate joins the path; at ``max_path`` paragraphs
   the best answer read so far is returned.

Questions of a batch move in lockstep: one model batch for all their queries, one
``search`` call, one model batch for all their candidates. ``retrieved`` is the
final reasoning path plus the paragraph the answer was read from (the paper's output);
the trace keeps every step's query, candidates, answerability and reranker scores.

Two options the paper does not have, both off by default: ``first_k`` reads deeper at
the first step, where the query comes from the question alone, and ``return_k`` fills
the returned paragraphs up to that many with the other candidates the loop read, best
reranker score first. A downstream reader then gets a pool the size Direct-R gives it
instead of the path alone. ``fill_order`` picks the fill's order: ``rerank`` (best reranker
score first) or ``retrieval`` (earlier step first, the retriever's rank within a step). The
second keeps the first step's candidates, retrieved with the question itself, ahead of later
steps' (retrieved with the weaker predicted queries), which the reranker often scores higher.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .base import Pipeline, register_pipeline
from .generation import answer_results
from .result import Chunk, Result

FILL_ORDERS = ("rerank", "retrieval")


@dataclass
class IRRRConfig:
    k: int = 5  # candidates retrieved per step (the paper's reranker sees 5)
    first_k: int | None = None  # candidates at the first step (default: k)
    return_k: int | None = None  # fill the returned paragraphs up to this many (default: path only)
    fill_order: str = "rerank"  # the fill's order: "rerank" score, or "retrieval" (step, then retriever rank)
    max_path: int = 4  # cap on reasoning-path paragraphs
    query_threshold: float = 0.3  # keep a path word in the query at p >= this (the paper favours recall)
    answer_threshold: float = 0.0  # stop once the best answerability reaches this
    max_query_words: int = 32
    max_answer_tokens: int = 30
    batch_size: int = 16
    bf16: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __post_init__(self) -> None:
        for name in ("k", "max_path", "max_query_words", "max_answer_tokens", "batch_size", "first_k", "return_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"IRRR option {name} must be a positive integer, got {value!r}")
        if self.fill_order not in FILL_ORDERS:
            raise ValueError(f"IRRR option fill_order must be one of {FILL_ORDERS}, got {self.fill_order!r}")


class IRRRRunner:
    """The loop over a retriever with a trained :class:`effrag.models.IRRRModel`."""

    def __init__(self, model, retriever, config: IRRRConfig | None = None):
        self.model, self.retriever = model.eval(), retriever
        self.config = config or IRRRConfig()

    def _depth(self, s: dict) -> int:
        """Candidates to read at this state's next step."""
        cfg = self.config
        return cfg.first_k if (cfg.first_k and not s["steps"]) else cfg.k

    def _encode(self, question_words, paragraphs):
        return self.model.encode(question_words, paragraphs)

    @torch.inference_mode()
    def run(self, questions: list[str]) -> list[dict]:
        from ..text import words_batch

        cfg = self.config
        states = [{"q": q, "qw": w, "path": [], "steps": [], "read": 0, "done": False,
                   "timing": {"model": 0.0, "retrieval": 0.0}}
                  for q, w in zip(questions, words_batch(list(questions)))]
        while True:
            active = [s for s in states if not s["done"]]
            if not active:
                break
            t0 = time.perf_counter()
            encs = [self._encode(s["qw"], s["path"]) for s in active]
            outs = self.model.predict(encs, cfg.batch_size, cfg.bf16)
            queries = []
            for s, e, o in zip(active, encs, outs):
                q, _ = self.model.search_query(e, o, cfg.query_threshold, cfg.max_query_words)
                queries.append(q or " ".join([s["q"]] + [p["title"] for p in s["path"]]))
            t1 = time.perf_counter()
            hits = self.retriever.search(queries, max(self._depth(s) + len(s["path"]) for s in active))
            t2 = time.perf_counter()
            jobs = []
            for si, (s, h) in enumerate(zip(active, hits)):
                on_path = {p["id"] for p in s["path"]}
                cands = [x for x in h if x.id not in on_path][: self._depth(s)]
                s["_cands"] = cands
                jobs += [(si, c) for c in cands]
            cand_encs = [self._encode(active[si]["qw"], active[si]["path"]
                                      + [{"id": c.id, "title": c.title, "text": c.text}]) for si, c in jobs]
            cand_outs = self.model.predict(cand_encs, cfg.batch_size, cfg.bf16) if jobs else []
            reads: dict[int, list] = {}
            for (si, c), e, o in zip(jobs, cand_encs, cand_outs):
                reads.setdefault(si, []).append((c, self.model.read(e, o, cfg.max_answer_tokens)))
            t3 = time.perf_counter()
            n = max(1, len(active))
            for si, s in enumerate(active):
                s["timing"]["model"] += (t1 - t0 + t3 - t2) / n
                s["timing"]["retrieval"] += (t2 - t1) / n
                self._advance(s, queries[si], reads.get(si, []))
        return [self._result(s, cfg.return_k, cfg.fill_order) for s in states]

    def _advance(self, s: dict, query: str, reads: list) -> None:
        cfg = self.config
        s["read"] += len(reads)
        s.setdefault("passages", {}).update((c.id, c) for c, _ in reads)  # what a returned id is
        step = {"query": query, "candidates": [c.id for c, _ in reads],
                "answerability": [round(r["answerability"], 4) for _, r in reads],
                "rerank": [round(r["rank"], 4) for _, r in reads]}
        if reads:
            c, r = max(reads, key=lambda x: x[1]["answerability"])
            step["best"] = {"id": c.id, "answer": r["answer"], "answerability": r["answerability"]}
            if r["answerability"] >= cfg.answer_threshold:
                step["stop"] = "answerable"
                s["steps"].append(step)
                s["done"] = True
                return
            nxt = max(reads, key=lambda x: x[1]["rank"])[0]
            s["path"].append({"id": nxt.id, "title": nxt.title, "text": nxt.text})
            step["appended"] = nxt.id
        s["steps"].append(step)
        if not reads:
            step["stop"] = "no candidates"
            s["done"] = True
        elif len(s["path"]) >= cfg.max_path:
            step["stop"] = "path cap"
            s["done"] = True

    @staticmethod
    def _result(s: dict, return_k: int | None = None, fill_order: str = "rerank") -> dict:
        return {**outcome(s["steps"], return_k, fill_order), "iterations": len(s["steps"]), "paragraphs_read": s["read"],
                "steps": s["steps"], "timing": s["timing"], "passages": s.get("passages", {})}


def read_irrr_config(path: str | Path | None) -> dict[str, Any]:
    """The IRRR loop options in ``path``: a JSON object of :class:`IRRRConfig` fields (a tuner's ``best.json``,
    :mod:`effrag.tuning.irrr`) or a model folder's ``irrr.json``, which holds them under ``"config"`` beside how
    they were chosen; None gives none. A field :class:`IRRRConfig` lacks is one error naming the file."""
    import json

    if path is None:
        return {}
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a JSON object ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object of IRRR options, got {type(config).__name__}")
    if "config" in config:  # irrr.json: the options and their provenance
        config = config["config"]
        if not isinstance(config, dict):
            raise ValueError(f"{path}: \"config\" is not a JSON object of IRRR options")
    unknown = sorted(set(config) - set(IRRRConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"{path}: unknown IRRR option(s) {unknown}; known: {sorted(IRRRConfig.__dataclass_fields__)}")
    return config


def outcome(steps: list[dict], return_k: int | None = None, fill_order: str = "rerank") -> dict:
    """Answer, returned ids and answerability from a run's step trace.

    The answer is the stopping step's best read, or (no stop) the most answerable read of any
    step; returned ids are the path as it was then, the paragraph read, and later path
    paragraphs. With ``return_k`` they are cut to, or filled up to, that many: the fill is
    every other candidate read in any step, highest reranker score first (a paragraph read
    at several steps counts with its best score), or with ``fill_order="retrieval"`` the first
    step's candidates in retrieval order, then the second's, and so on (a paragraph counts where
    it was first read). ``scripts/tune_irrr.py`` replays other thresholds and orders through this too.
    """
    appended = [st.get("appended") for st in steps]
    scored = [i for i, st in enumerate(steps) if "best" in st]
    if not scored:
        ids, answer, answerability = [a for a in appended if a], "", 0.0
    else:
        stopped = steps[-1].get("stop") == "answerable"
        j = scored[-1] if stopped else max(scored, key=lambda i: steps[i]["best"]["answerability"])
        best = steps[j]["best"]
        ids = [a for a in appended[:j] if a] + [best["id"]]
        ids += [a for a in appended[j:] if a and a not in ids]
        answer, answerability = best["answer"], best["answerability"]
    if return_k is not None:
        if fill_order not in FILL_ORDERS:
            raise ValueError(f"fill_order must be one of {FILL_ORDERS}, got {fill_order!r}")
        rank: dict[str, tuple] = {}  # smallest key first
        for si, st in enumerate(steps):
            for pos, (cid, score) in enumerate(zip(st["candidates"], st["rerank"])):
                key = (-score,) if fill_order == "rerank" else (si, pos)
                rank[cid] = min(key, rank.get(cid, key))
        taken = set(ids)
        ids = (ids + sorted((c for c in rank if c not in taken), key=lambda c: rank[c]))[:return_k]
    return {"retrieved": ids, "answer": answer, "answerability": answerability}


DEFAULT_MODEL = "irrr-all"  # the shipped IRRR model (effrag.pretrained)
CONFIG_NAME = "irrr.json"  # a model folder's chosen loop options (scripts/irrr_report.py writes it)


def folder_config(path: str | Path) -> dict[str, Any]:
    """The loop options a model folder carries in ``irrr.json`` (the cross-fitted choice of
    ``scripts/irrr_report.py``, :func:`read_irrr_config`); empty when the folder has none (the paper's loop)."""
    f = Path(path) / CONFIG_NAME
    return read_irrr_config(f) if f.is_file() else {}


@register_pipeline("irrr")
class IRRRPipeline(Pipeline):
    """IRRR as an ``effrag eval`` method: ``--irrr-model DIR|NAME`` (default the shipped ``irrr-all``) plus the
    loop options. A model folder's ``irrr.json`` (:func:`folder_config`) gives the options a ``config`` does not;
    keyword options override either.

    IRRR answers with its own reader; a ``generator`` (``--reader DIR`` or ``--llm``) answers its
    returned paragraphs instead, so it compares with other methods on the same reader.
    """

    uses_generator = True
    k_in_config = True  # candidates per step: the model's irrr.json (or the paper's 5) unless --k is given

    def __init__(self, retriever, irrr_model=DEFAULT_MODEL, k: int | None = None,
                 config: IRRRConfig | dict | None = None, generator: Any = None, **options: Any):
        from ..models import HEADS_NAME, IRRRModel
        from ..pretrained import resolve_model

        path = None
        if not isinstance(irrr_model, torch.nn.Module):
            path = resolve_model(irrr_model or DEFAULT_MODEL)
            if not (path / HEADS_NAME).is_file():
                raise FileNotFoundError(f"IRRR checkpoint {path}: no {HEADS_NAME} there (train one with "
                                        "`python scripts/train_models.py --models irrr --name all --processes 2`)")
        if isinstance(config, IRRRConfig):
            base = asdict(config)
        else:
            base = dict(config) if config is not None else (folder_config(path) if path is not None else {})
        base.update({key.removeprefix("irrr_"): v for key, v in options.items() if v is not None})
        if k is not None:  # given by the caller (k_in_config: effrag eval passes --k only when it is given)
            base["k"] = k
        unknown = set(base) - set(IRRRConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown IRRR option(s) {sorted(unknown)}; known: {sorted(IRRRConfig.__dataclass_fields__)}")
        model = IRRRModel.from_pretrained(path) if path is not None else irrr_model
        self.config = IRRRConfig(**base)
        self.runner = IRRRRunner(model, retriever, self.config)
        self.generator = generator

    @classmethod
    def add_args(cls, parser) -> None:
        g = parser.add_argument_group("irrr")
        g.add_argument("--irrr-model", metavar="DIR|NAME", default=DEFAULT_MODEL,
                       help=f"trained IRRR checkpoint folder or a shipped name (default {DEFAULT_MODEL})")
        g.add_argument("--irrr-max-path", type=int, default=None, help="cap on reasoning-path paragraphs")
        g.add_argument("--irrr-first-k", type=int, default=None,
                       help="candidates read at the first step (default: --k)")
        g.add_argument("--irrr-return-k", type=int, default=None,
                       help="return this many paragraphs: the path, then the other candidates read, by reranker "
                            "score (default: the path and the answer's paragraph, as the paper)")
        g.add_argument("--irrr-fill-order", choices=FILL_ORDERS, default=None,
                       help="order of the --irrr-return-k fill: reranker score (default) or retrieval "
                            "(first step's candidates first, in the retriever's order)")
        g.add_argument("--irrr-query-threshold", type=float, default=None, help="query-word keep probability")
        g.add_argument("--irrr-answer-threshold", type=float, default=None, help="answerability that stops the loop")
        g.add_argument("--irrr-batch-size", type=int, default=None)
        g.add_argument("--irrr-bf16", action="store_true", default=None, help="bf16 autocast for the model")

    def run(self, question: str) -> Result:
        return self.run_batch([question])[0]

    def run_batch(self, questions: list[str]) -> list[Result]:
        """Each result's chunks are the returned paragraphs, all scored by the answer's answerability;
        a chunk's hop is the step that first read it, its query that step's query."""
        results = []
        for q, r in zip(questions, self.runner.run(list(questions))):
            first_read: dict[str, tuple[int, str]] = {}
            for i, step in enumerate(r["steps"]):
                for cid in step["candidates"]:
                    first_read.setdefault(cid, (i, step["query"]))
            chunks = [Chunk.from_hit(r["passages"][cid], hop=first_read[cid][0], query=first_read[cid][1],
                                     score=r["answerability"]) for cid in r["retrieved"]]
            results.append(Result(q, chunks, r["answer"], hops=r["steps"], iterations=r["iterations"],
                                  timing=r["timing"], extra={"paragraphs_read": r["paragraphs_read"]}))
        if self.generator is not None:  # the generator answers; IRRR's own answer stays in extra
            own = [res.answer for res in results]
            for res, mine, reply in zip(results, own, answer_results(self.generator, results)):
                res.extra["irrr_answer"] = mine
                res.generation = reply.get("trace")
        return results
