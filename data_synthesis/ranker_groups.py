"""Training groups for the pool ranker (``effrag ranker-data``): each gold chunk against a query's hard negatives.

The positives are the synthesised Labeler records with tag 1: every (query, gold chunk) the loop should
keep, the question at hop 1 and each oracle next query after it, and the later hops' gold under the
question too (the pool is cut from chunks read under both). The negatives are what the loop will read
beside them: the retriever's top ``depth`` hits for the same query that are not gold (by id or by gold
title, so that another copy of a gold article is never taught as irrelevant) and, under the question,
the question's own distractor paragraphs (chosen by the dataset's authors to look relevant).

Each (query, gold chunk) gives ``groups_per_positive`` groups of one gold and ``negatives`` negatives,
disjoint draws from a seeded shuffle of that query's negatives: the model always sees a full group in one
softmax (``effrag.training.tasks.ranker``), and two groups show it twice as many negatives per positive.
A record: ``{"qid", "dataset", "hop", "query", "candidates": [{"chunk_id", "title", "text", "gold"}]}``,
the gold first.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from effrag.data.records import Question, normalize_space


def _title_key(title: str) -> str:
    return normalize_space(title).casefold()


def positives(labeler_records: Iterable[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """``(qid, query) -> {gold chunk id: hop}`` from Labeler records with tag 1, in first-seen order."""
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for r in labeler_records:
        if int(r.get("tag", 0)) == 1:
            out[(r["qid"], r["query"])].setdefault(r["chunk_id"], int(r.get("hop", 1)))
    return out


def _rng(seed: int, *parts: str) -> random.Random:
    """A random stream of its own for each (query, gold chunk): groups never depend on the order of the input."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def info_queries(filter_records: Iterable[dict]) -> dict[tuple[str, str], str]:
    """``(qid, next query) -> its Filter input`` ("<query> Info: <kept words>") from synthesised Filter records: what
    the loop's ranker reads a later hop's chunks under with ``rank_query: info``."""
    from effrag.text import join_words

    out: dict[tuple[str, str], str] = {}
    for f in filter_records:
        out.setdefault((f["qid"], f["target"]), join_words(f["words"]))
    return out


def ranker_groups(questions: Sequence[Question], labeler_records: Iterable[dict], retriever, *, depth: int = 30,
                  negatives: int = 7, groups_per_positive: int = 2, context: bool = True, seed: int = 0,
                  batch_size: int = 256, infos: dict[tuple[str, str], str] | None = None,
                  question_first_hop_only: bool = False) -> tuple[list[dict], dict[str, int]]:
    """The ranker's training groups and counts (see the module docstring).

    ``retriever.search`` must reach the questions' gold passages by the ids the Labeler records use (the
    corpus pooled from the same files). A (query, gold) pair whose gold is not in the corpus, or whose query
    has fewer than ``negatives`` negatives, gives no group (counted). With ``infos`` (:func:`info_queries`), a
    next query's groups come twice: under the query, and under its Filter input (the same gold and negatives:
    the loop retrieves with the query and, with ``rank_query: info``, ranks under the Filter input).
    ``question_first_hop_only`` leaves out the groups of a later hop's gold under the question: the question
    alone does not say that the bridge entity's paragraph is relevant, so those groups teach the ranker to
    guess; the loop reads such a chunk again under the next query (``rescore_top``), where it can tell.
    """
    if negatives < 1 or groups_per_positive < 1 or depth < negatives:
        raise ValueError(f"need negatives >= 1, groups_per_positive >= 1 and depth >= negatives, got "
                         f"negatives={negatives}, groups_per_positive={groups_per_positive}, depth={depth}")
    by_id = {q.id: q for q in questions}
    pos = positives(labeler_records)
    keys = [k for k in pos if k[0] in by_id]
    counts = {"queries": len(keys), "groups": 0, "info_groups": 0, "later_hop_under_question": 0,
              "no_gold_passage": 0, "few_negatives": 0,
              "unknown_question": len(pos) - len(keys)}
    passages = {p.id: p for q in questions for p in q.contexts}
    groups: list[dict] = []
    for start in range(0, len(keys), batch_size):
        batch = keys[start:start + batch_size]
        hits = retriever.search([query for _, query in batch], depth)
        for (qid, query), ranked in zip(batch, hits):
            q = by_id[qid]
            gold_ids = set(q.gold_ids)
            gold_titles = {_title_key(p.title) for p in q.gold}
            negs: dict[str, Any] = {}
            for h in ranked:
                if h.id not in gold_ids and _title_key(h.title) not in gold_titles:
                    negs.setdefault(h.id, h)
            if context and query == q.question:
                for p in q.contexts:
                    if p.id not in gold_ids and _title_key(p.title) not in gold_titles:
                        negs.setdefault(p.id, p)
            for pid, hop in pos[(qid, query)].items():
                if question_first_hop_only and hop > 1 and query == q.question:
                    counts["later_hop_under_question"] += 1
                    continue
                gold = passages.get(pid)
                if gold is None:
                    counts["no_gold_passage"] += 1
                    continue
                if len(negs) < negatives:
                    counts["few_negatives"] += 1
                    continue
                order = sorted(negs)
                _rng(seed, qid, query, pid).shuffle(order)
                info = (infos or {}).get((qid, query))
                for g in range(min(groups_per_positive, len(order) // negatives)):
                    cands = [gold] + [negs[i] for i in order[g * negatives:(g + 1) * negatives]]
                    for text in [query] + ([info] if info else []):
                        groups.append({"qid": qid, "dataset": q.dataset, "hop": hop, "query": text, "candidates": [
                            {"chunk_id": c.id, "title": c.title, "text": c.text, "gold": int(i == 0)}
                            for i, c in enumerate(cands)]})
                        counts["groups"] += 1
                        counts["info_groups"] += text is info
    return groups, counts


def write_ranker_data(synth_dir: str | Path, inputs: Sequence[str | Path], output: str | Path, retriever: str = "hybrid",
                      *, cache_dir: str | Path | None = None, bf16: bool = True, **options: Any) -> dict[str, Any]:
    """``effrag ranker-data``: ``<output>/ranker.jsonl`` and ``<output>/ranker_data.json`` (settings, counts).

    The corpus is pooled from ``inputs`` (the files the Labeler records were synthesised from), searched by a
    ``retriever`` of that kind (cached as every run's index is).
    """
    from effrag.jsonl import numbered_jsonl
    from effrag.setup import RunSetup

    labeler = Path(synth_dir) / "labeler.jsonl"
    if not labeler.is_file():
        raise FileNotFoundError(f"{labeler} not found (an `effrag synthesize` output folder is needed)")
    records = [rec for _, rec in numbered_jsonl(labeler)]
    if options.pop("info", False):
        options["infos"] = info_queries(rec for _, rec in numbered_jsonl(Path(synth_dir) / "filter.jsonl"))
    # one corpus pooled from every input, as synthesis mined the Labeler's negatives
    setup = RunSetup.build(list_questions(inputs), corpus_from=list(inputs), retriever=retriever, bf16=bf16,
                           cache_dir=cache_dir)
    groups, counts = ranker_groups(setup.questions, records, setup.retriever, **options)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    from effrag.state_files import atomic_open, write_text_atomic

    with atomic_open(out / "ranker.jsonl") as fh:
        for g in groups:
            fh.write(json.dumps(g, ensure_ascii=False) + "\n")
    info = {"synth": str(synth_dir), "inputs": [str(f) for f in inputs], "retriever": retriever,
            **{k: v for k, v in options.items() if k != "infos"}, "info": "infos" in options, **counts}
    write_text_atomic(out / "ranker_data.json", json.dumps(info, indent=2))
    return info


def list_questions(inputs: Sequence[str | Path]) -> list[Question]:
    from effrag.data import load_questions

    return [q for f in inputs for q in load_questions(f)]
