#!/usr/bin/env python
"""How much better could EfficientRAG's pool order be with the signals the loop already has?

Runs the loop once on a dev file with ``--er-config`` and once more (model calls cached, so free) with
every labeled chunk kept (``pool_source: seen``, no cap). Over those seen chunks it compares, at 1..10
chunks:

* ``config``: the configuration's own pool order (what ``effrag eval`` returns);
* ``learned (CV)``: a linear ranker over the loop's own signals, fit with a listwise softmax loss on
  K-1 folds of the questions and scored on the held-out fold (the honest estimate), and ``learned
  (in-sample)``: fit on every question (an upper bound of what such a ranker can do here);
* ``oracle``: every seen gold passage first (the ceiling of any order of the seen set);
* ``Direct-R@k`` on the same retriever.

The signals: the Labeler's logit p(<Continue>); the retriever's score under the query that found the
chunk; its best score under the hop >= 1 queries (``requery``); hop 1 / hop >= 2; tagged <Continue>;
log rank in hop 0's retrieval; the share of the title's words in the question and in the later queries.
If ``learned (CV)`` does not beat ``config``, the order is saturated with what the Labeler says, and the
next gain must come from the models (reports/archive/efficientrag/requery/README.md).

    python scripts/probes/probe_pool_ranking.py --labeler D/labeler --filter D/filter --er-config D/loop-musique.json \\
        --questions ../shared/data/musique/dev.jsonl --corpus-from ../shared/data/musique/train.jsonl \\
        --retriever dense --bf16 --n 0 --output reports/archive/efficientrag/requery/probe-musique
"""
from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FEATURES = ("labeler_logit", "retrieval_score", "requery_score", "hop1", "hop2+", "continue", "log_rank_hop0",
            "title_in_question", "title_in_later_queries")
_STOP = frozenset("the a an of in on at to for and or is was were be by with from as that this which who what when "
                  "where how did does do its it his her their".split())


def _tokens(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def features(result) -> list[list[float]]:
    """One row of :data:`FEATURES` per chunk of ``result`` (a seen-pool run with requery scores)."""
    from effrag.pipelines.efficientrag import logit  # the loop's own clipped log-odds

    hops = result.hops
    rank0 = {c["id"]: i for i, c in enumerate(hops[0]["chunks"])} if hops else {}
    later = _tokens(" ".join(q for e in hops[1:] for q in e["queries"]))
    question = _tokens(result.question)
    requery = result.extra.get("requery_scores", {})
    rows = []
    for c in result.chunks:
        title = _tokens(c.title) or {""}
        rows.append([logit(c.score), c.retrieval_score, requery.get(c.id, 0.0), float(c.hop == 1),
                     float(c.hop >= 2), float(not c.fallback), math.log1p(rank0.get(c.id, len(rank0))),
                     len(title & question) / len(title), len(title & later) / len(title)])
    return rows


def fit_ranker(data, l2: float = 1e-3):
    """Listwise linear ranker: softmax over each question's chunks, cross-entropy to its gold ones."""
    import torch

    data = [(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
            for x, y in data if len(y) and sum(y)]
    if not data:
        raise SystemExit("no question has a seen gold passage: nothing to fit")
    allx = torch.cat([x for x, _ in data])
    mu, sd = allx.mean(0), allx.std(0) + 1e-6
    w = torch.zeros(allx.shape[1], requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = sum(-(torch.log_softmax(((x - mu) / sd) @ w, 0) * y).sum() / y.sum() for x, y in data) / len(data)
        loss = loss + l2 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    weights = (w.detach() / sd).tolist()  # per raw feature (the mean shift does not change a ranking)
    return lambda x: [sum(a * b for a, b in zip(row, weights)) for row in x], weights


def curve(orders, gold, k_max: int = 10) -> list[float]:
    from effrag.evaluation.metrics import recall

    return [100 * sum(recall(ids[:k], g) for ids, g in zip(orders, gold)) / len(gold) for k in range(1, k_max + 1)]


def ranked(result, scores) -> list[str]:
    return [c.id for _, _, c in sorted(zip([-s for s in scores], range(len(scores)), result.chunks))]


def main(argv=None) -> int:
    from effrag.cli_args import add_batch_size_arg, add_method_args, add_output_arg, add_run_args, add_source_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, sample=True, retriever_default="dense")
    add_method_args(p, "efficientrag")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds over the questions (default 5)")
    add_batch_size_arg(p, 64, of="questions per loop call")
    add_output_arg(p, required=True)
    add_source_args(p)
    args = p.parse_args(argv)
    if args.folds < 2:
        p.error("--folds must be >= 2")
    from effrag.provenance import report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    import logging

    from effrag.cli_args import method_options
    from effrag.evaluation.report import md_table
    from effrag.pipelines import build_pipeline
    from effrag.setup import RunSetup
    from effrag.tuning import CachedModel, CachedRetriever, direct_r_curve

    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    run = RunSetup.from_args(args, own_contexts=True)
    loop = build_pipeline("efficientrag", run.retriever, **method_options(args)).loop
    loop.retriever = CachedRetriever(loop.retriever)
    loop.labeler, loop.filter = CachedModel(loop.labeler, pairs=True), CachedModel(loop.filter, pairs=False)
    texts, gold = run.texts, run.gold
    batches = lambda: [r for i in range(0, len(texts), args.batch_size)  # noqa: E731
                       for r in loop.run(list(texts[i: i + args.batch_size]))]
    config = loop.config
    loop.config = config.replace(max_candidates=None)
    own = batches()
    loop.config = config.replace(max_candidates=None, min_candidates=0, pool_source="seen",
                                 pool_order="fused" if config.pool_order == "hop" else config.pool_order,
                                 requery_weight=config.requery_weight or 1e-9)  # records every later query's hits
    seen = batches()
    x = [features(r) for r in seen]
    gold_sets = [set(g) for g in gold]
    y = [[float(c.id in g) for c in r.chunks] for r, g in zip(seen, gold_sets)]
    idx = list(range(len(seen)))
    random.Random(args.seed or 0).shuffle(idx)
    cv_scores: list = [None] * len(seen)
    for f in range(args.folds):
        test = set(idx[f::args.folds])
        score, _ = fit_ranker([(x[i], y[i]) for i in idx if i not in test])
        for i in test:
            cv_scores[i] = score(x[i])
    score_all, weights = fit_ranker(list(zip(x, y)))
    oracle = [sorted((c.id for c in r.chunks), key=lambda cid, g=g: cid not in g) for r, g in zip(seen, gold_sets)]
    direct = {d["k"]: 100 * d["recall"] for d in direct_r_curve(loop.retriever, texts, gold, 10)}
    rows = {"config": curve([[c.id for c in r.chunks] for r in own], gold),
            "learned (CV)": curve([ranked(r, s) for r, s in zip(seen, cv_scores)], gold),
            "learned (in-sample)": curve([ranked(r, score_all(xi)) for r, xi in zip(seen, x)], gold),
            "oracle order of the seen chunks": curve(oracle, gold),
            "Direct-R@k": [direct[k] for k in range(1, 11)]}
    avg_seen = sum(len(r.chunks) for r in seen) / len(seen)
    table = md_table(["order"] + [str(k) for k in range(1, 11)],
                     [[name] + [f"{v:.2f}" for v in vals] for name, vals in rows.items()])
    md = (f"# Pool ranking probe: {len(texts)} questions of {run.sources['questions']}\n\n"
          f"Recall % of the pool cut at k chunks; {avg_seen:.1f} chunks seen per question; {args.folds}-fold CV "
          f"by question.\n\n{table}\n\nLearned weights (in-sample, per raw feature): "
          + ", ".join(f"{n} {w:+.3f}" for n, w in zip(FEATURES, weights)) + "\n")
    write_report(args.output, md, {"curves": rows, "features": list(FEATURES), "weights": weights,
                                   "avg_seen": avg_seen, "n": len(texts), "setup": run.identity(),
                                   "loop_config": config.to_json()}, args=args, argv=argv, commit=commit)
    print(md)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError) as e:  # a missing file, a bad config or dataset: one line, no traceback
        sys.exit(f"probe_pool_ranking: error: {e}")
