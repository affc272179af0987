"""IRRR training data: oracle reasoning paths with queries, retrieved candidates and reader targets.

For each training question (gold paragraphs mapped to corpus ids) a reasoning path is
grown step by step (section 3.4.2):

1. for every gold paragraph not yet on the path, the dynamic oracle (``irrr_oracle.py``)
   finds its best query from the path; the target whose oracle rank is best is this
   step's target, and its query-term labels make the *query* example;
2. the oracle query is run against the real engine: its top ``candidates`` paragraphs
   (minus the path; the target swapped in if missing) are the reranker's candidates,
   gold ones positive. Each candidate is also a *reader* example: NOANSWER unless the
   path plus that candidate holds every gold paragraph, in which case the answer type
   is SPAN / YES / NO (the span is found in the words at featurization);
3. the path is extended with the target, or, with probability ``augment_p`` (at most
   once per path), with the best non-gold candidate, so the next oracle query teaches
   the model to *recover* from a retrieval mistake.

One JSONL record per step (``irrr.jsonl``, counts in ``stats.json``); questions are written whole with a done
marker (``effrag.jsonl.ResumableWriter``), so an interrupted run resumes where it
stopped. BM25 ranks come from the foundation's BM25 index (``scores``: every
passage's score, so ranks are exact).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from effrag.data import Corpus, Question, map_gold
from effrag.jsonl import ResumableWriter, read_jsonl
from effrag.state_files import write_json_atomic
from effrag.text import words

from .irrr_oracle import make_rank_fn, oracle_query

FILE = "irrr"


def answer_type(answer: str) -> str:
    a = answer.strip().lower()
    return a if a in {"yes", "no"} else "span"


def _passage(corpus: Corpus, pid: str) -> dict:
    p = corpus[pid]
    return {"id": p.id, "title": p.title, "text": p.text}


class _Words:
    """Cached word splits of passages (paths revisit the same paragraphs many times)."""

    def __init__(self):
        self.cache: dict[str, tuple[list[str], list[str]]] = {}

    def __call__(self, p: dict) -> tuple[list[str], list[str]]:
        if p["id"] not in self.cache:
            self.cache[p["id"]] = (words(p["title"]), words(p["text"]))
        return self.cache[p["id"]]


def question_steps(q: Question, gold: list[str], corpus: Corpus, bm25, rank, rng: random.Random,
                   wordsof: _Words, candidates: int = 5, augment_p: float = 0.3) -> list[dict]:
    """The step records of one question (see module doc)."""
    qwords = words(q.question)
    path: list[dict] = []
    recovered = False
    out: list[dict] = []
    gold_set = set(gold)
    for step in range(len(gold) + 2):
        on_path = {p["id"] for p in path}
        remaining = [g for g in gold if g not in on_path]
        if not remaining:
            break
        segments = [qwords]
        for p in path:
            segments += list(wordsof(p))
        best = None
        for g in remaining:
            tw, xw = wordsof(_passage(corpus, g))
            o = oracle_query(segments, g, tw + xw, rank)
            if best is None or o.rank < best.rank:
                best = o
        query = best.query or q.question
        hits = bm25.search([query], candidates + len(path))[0]
        cands = [h.id for h in hits if h.id not in on_path][:candidates]
        if best.target not in cands:
            cands = cands[: candidates - 1] + [best.target]
        cand_recs = []
        for cid in cands:
            complete = gold_set <= on_path | {cid}
            cand_recs.append({**_passage(corpus, cid), "gold": int(cid in gold_set),
                              "answer_type": answer_type(q.answers[0]) if complete else "noanswer"})
        out.append({
            "qid": q.id, "dataset": q.dataset, "question": q.question, "answers": q.answers,
            "step": step, "recovery": recovered, "path": [dict(p) for p in path],
            "query_labels": best.labels, "query_terms": best.spans, "target": best.target,
            "oracle_rank": best.rank, "candidates": cand_recs,
        })
        distractors = [c for c in cand_recs if not c["gold"]]
        if not recovered and distractors and rng.random() < augment_p:
            nxt = distractors[0]
            recovered = True
        else:
            nxt = _passage(corpus, best.target)
        path.append({k: nxt[k] for k in ("id", "title", "text")})
    return out


def build_irrr_data(questions: Sequence[Question], corpus: Corpus, bm25, out_dir: str | Path, *,
                    candidates: int = 5, augment_p: float = 0.3, seed: int = 0, progress: bool = True) -> dict:
    """Write ``out_dir/irrr.jsonl`` (resumable); returns counts of this run."""
    from tqdm.auto import tqdm

    if not hasattr(bm25, "scores"):
        raise TypeError(f"{type(bm25).__name__} has no scores(query): the oracle needs a BM25 retriever")
    rank = make_rank_fn(bm25, corpus.position)
    gold_ids, report = map_gold(questions, corpus, report=True)
    wordsof = _Words()
    stats = {"questions": 0, "skipped_done": 0, "skipped_no_gold": 0, "steps": 0, "recovery_steps": 0,
             "oracle_rank_1": 0, "oracle_top5": 0}
    with ResumableWriter(out_dir, files=(FILE,)) as writer:
        for q, gold in tqdm(list(zip(questions, gold_ids)), desc="irrr data", disable=not progress):
            if writer.is_done(q.dataset, q.id):
                stats["skipped_done"] += 1
                continue
            if len(gold) < len(q.gold) or not gold or not q.answers:
                writer.write_records(q.dataset, q.id, {FILE: []}, status="no_gold")
                stats["skipped_no_gold"] += 1
                continue
            # one generator per question: a resumed run makes the same choices
            rng = random.Random(f"{seed}:{q.dataset}:{q.id}")
            recs = question_steps(q, gold, corpus, bm25, rank, rng, wordsof, candidates, augment_p)
            writer.write_records(q.dataset, q.id, {FILE: recs})
            stats["questions"] += 1
            stats["steps"] += len(recs)
            stats["recovery_steps"] += sum(r["recovery"] for r in recs)
            stats["oracle_rank_1"] += sum(r["oracle_rank"] == 1 for r in recs)
            stats["oracle_top5"] += sum(r["oracle_rank"] <= 5 for r in recs)
    out = Path(out_dir)
    write_json_atomic(out / "stats.json", file_stats(out / f"{FILE}.jsonl"), indent=2)
    return stats


def file_stats(path: str | Path) -> dict:
    """Counts over a whole ``irrr.jsonl`` (all runs that wrote to it), for ``stats.json``."""
    n = qs = rec = r1 = r5 = answerable = cands = 0
    per_ds: dict[str, int] = {}
    for r in read_jsonl(path):
        n += 1
        qs += r["step"] == 0
        rec += bool(r["recovery"])
        r1 += r["oracle_rank"] == 1
        r5 += r["oracle_rank"] <= 5
        cands += len(r["candidates"])
        answerable += sum(c["answer_type"] != "noanswer" for c in r["candidates"])
        per_ds[r["dataset"]] = per_ds.get(r["dataset"], 0) + 1
    return {"questions": qs, "steps": n, "steps_per_dataset": per_ds, "recovery_steps": rec,
            "oracle_rank_1": r1 / max(1, n), "oracle_top5": r5 / max(1, n), "candidates": cands,
            "answerable_candidates": answerable}
