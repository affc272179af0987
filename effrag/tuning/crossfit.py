"""Cross-fitted figures: a setting chosen on some questions is scored only on others.

A tuning folder's rows (:func:`effrag.tuning.run_grid`) hold, per config, every question's gold positions
in the ranked pool (``per_question``), so that any cut of the pool can be scored on any subset of the
questions without rerunning the loop. "At most ``b`` chunks" cuts every question's pool at ``b``
(``max_candidates = b``): a per-question bound, not an average.

A config is chosen for a set of chunk budgets (the project's bars: 7 and 10) by its mean recall over them,
and over the datasets when several are given (``loop.json``: one config for every dataset); or, with
``floors``, as the cheapest config (by what it reads) whose recall keeps the bar (the strongest plain
retriever's recall on the same choosing questions, plus a margin) at every budget, the best recall on a tie. The config
ships with ``max_candidates`` = the largest budget; its pool cut at a smaller budget is the same config with
a smaller ``max_candidates``.

:func:`crossfit` splits the questions into ``k`` folds (a seeded shuffle of their ids, so a file's order
does not decide them), chooses on the other ``k - 1`` folds, scores the held-out fold, and pools the held-out
scores: what the tuning protocol gives on questions it never saw. :func:`choose` is the same choice on every
question given (the config to ship; its card says which questions chose it).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CAPS = tuple(range(1, 11))
# a rule's final choice among its set: best recall, the simplest within one standard error, or the cheapest cost
# point within one standard error and then its simplest (:func:`_best`)
PREFER = ("recall", "simple", "cheap")


def config_key(config: Mapping[str, Any]) -> str:
    """A config as one string, its cap left out (rows of several tuning folders match on it)."""
    return json.dumps({k: v for k, v in config.items() if k != "max_candidates"}, sort_keys=True)


def folds(ids: Sequence[str], k: int, seed: int = 0) -> dict[str, int]:
    """Question id -> fold in ``0..k-1``: sizes differ by at most one, order by a seeded hash of the id."""
    if k < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {k}")
    order = sorted(dict.fromkeys(ids), key=lambda q: hashlib.sha256(f"{seed}:{q}".encode()).hexdigest())
    return {q: i % k for i, q in enumerate(order)}


def _cut(pq: list, cap: int) -> tuple[float, float]:
    """(recall, chunks) of one question's pool cut at ``cap``."""
    _, n_gold, at, size = pq[:4]
    found = sum(1 for p in at if p <= cap)
    return (found / n_gold if n_gold else 1.0), float(min(cap, size))


def ranker_factor_of(config: Mapping[str, Any], factor: float | Mapping[str, float]) -> float:
    """The read factor of the ranker a row's config names (``"ranker"``, default the system's ``ranker/``)."""
    if isinstance(factor, Mapping):
        return float(factor.get(config.get("ranker") or "ranker", 1.0))
    return float(factor)


class Candidates:
    """One dataset's configs (tuning rows), each scored at every cut of its pool on each question."""

    def __init__(self, rows: Iterable[dict], caps: Sequence[int] = CAPS,
                 ranker_factor: float | Mapping[str, float] = 1.0):
        self.caps = list(caps)
        # a ranker read's cost against a Labeler read (loop_cost.ranker_read_factor): one for every row, or one per
        # ranker folder a row's config names ("ranker": rows of two rankers tuned apart and chosen among together)
        self.ranker_factor = ranker_factor
        self.rows: dict[str, dict] = {}
        for r in rows:
            if "per_question" not in r:
                raise ValueError("a tuning row without per_question scores (rerun the grid to cross-fit it)")
            cap = r["config"].get("max_candidates")  # a capped run config is another pool than the uncapped one
            self.rows.setdefault(config_key(r["config"]) + (f"|cap{cap}" if cap is not None else ""), r)
        if not self.rows:
            raise ValueError("no tuning rows")
        self.ids = [pq[0] for pq in next(iter(self.rows.values()))["per_question"]]
        self.scores: dict[str, dict[int, list[tuple[float, float]]]] = {}
        self.cost: dict[str, list[list[float]]] = {}  # each question's forwards: what the loop read for it
        for key, r in self.rows.items():
            by_id = {pq[0]: pq for pq in r["per_question"]}
            if set(by_id) != set(self.ids):
                raise ValueError("tuning rows of one folder score different questions")
            own = r["config"].get("max_candidates")
            self.scores[key] = {c: [_cut(by_id[q], c if own is None else min(c, own)) for q in self.ids]
                                for c in self.caps}
            self.cost[key] = [list(by_id[q][4]) if len(by_id[q]) > 4 else [0, 0, 0] for q in self.ids]

    def read_cost(self, key: str, members: Sequence[int]) -> float:
        """The members' mean reading cost under config ``key``, in trained-length pair reads."""
        from .loop_cost import read_cost

        config = self.rows[key]["config"]
        factor = ranker_factor_of(config, self.ranker_factor)
        return sum(read_cost(config, self.cost[key][i], factor) for i in members) / len(members)

    def mean(self, key: str, cap: int, members: Sequence[int]) -> tuple[float, float]:
        s = self.scores[key][cap]
        return sum(s[i][0] for i in members) / len(members), sum(s[i][1] for i in members) / len(members)

    def config(self, key: str, cap: int) -> dict:
        own = self.rows[key]["config"].get("max_candidates")
        return {**self.rows[key]["config"], "max_candidates": cap if own is None else min(cap, own)}


def _best(cands: Mapping[str, Candidates], members: Mapping[str, Sequence[int]], budgets: Sequence[int],
          floors: Mapping[str, Mapping[int, Mapping[str, Mapping[str, float]]]] | None = None,
          margin: float | str = 0.0, prefer: str = "recall") -> str:
    """The config with the best recall averaged over ``budgets`` and datasets; fewer chunks, then the config's
    key, break ties (deterministic).

    With ``floors`` (the *cheapest-that-keeps-the-bar* rule): among the configs whose recall on the member
    questions reaches, at every budget of every dataset, the floor on the same questions plus ``margin`` (a recall
    difference, or ``"se"``: one standard error of the per-question difference to that baseline, so that a small
    or noisy dev file asks a wider margin than a large one), the one
    that reads least (:func:`effrag.tuning.loop_cost.read_cost`), best recall on a tie; when none does, the best
    recall as above. ``floors[dataset][budget]`` maps each baseline (a retriever kind) to its recall per question
    id; the floor is the strongest baseline's mean over the members, so a fold's bar is measured on that fold's
    questions only.

    ``prefer="simple"`` (the one-standard-error rule): instead of the best recall of that final set, the simplest
    config whose recall is within one standard error of the best one's (:func:`simplest_within_se`); with
    ``floors`` the set is the cheapest config's structure (its options but the pool weights) among those that keep
    the bar, so that pool weights whose reads differ by noise are compared as one cost point.

    ``prefer="cheap"`` (issue #67's *cost breaks ties*, measured and not shipped: the shipped configs are the best
    recall): every cost point competes on its cross-fitted recall over the members; of those within one standard
    error of the best, the cheapest; that point's best-recall config (:func:`cheapest_within_se`)."""
    if prefer not in PREFER:
        raise ValueError(f"prefer={prefer!r}: expected one of {', '.join(map(repr, PREFER))}")
    bad = [b for b in budgets if b not in next(iter(cands.values())).caps]
    if bad:
        raise ValueError(f"budgets {bad} are not among the scored caps")
    shared = sorted(set.intersection(*(set(c.rows) for c in cands.values())))
    if not shared:
        raise ValueError(f"no config is shared by the tuning rows of {sorted(cands)}")

    score = _score_on(cands, members, budgets)
    pool = shared
    if floors is not None:
        def keeps_bar(key: str) -> bool:
            for d, c in cands.items():
                ids = [c.ids[i] for i in members[d]]
                for b in budgets:
                    mine = [c.scores[key][b][i][0] for i in members[d]]
                    base = strongest(floors[d][b], ids)
                    diff = [m - base[q] for m, q in zip(mine, ids)]
                    need = standard_error(diff) if margin == "se" else float(margin)
                    if sum(diff) / len(diff) < need - 1e-12:
                        return False
            return True

        keeps = [key for key in shared if keeps_bar(key)]
        if keeps:
            cost = {key: round(sum(cands[d].read_cost(key, members[d]) for d in cands) / len(cands), 9)
                    for key in keeps}
            cheapest = min(cost.values())
            pool = [key for key in keeps if cost[key] == cheapest]
            if prefer == "simple":
                shape = structure(cands_config(cands, pool[0]))
                pool = [key for key in keeps if structure(cands_config(cands, key)) == shape]
    if prefer == "simple":
        return simplest_within_se(cands, members, budgets, pool, score)
    if prefer == "cheap":
        return cheapest_within_se(cands, members, budgets, pool, score)
    return _top(pool, score)


def _top(pool: Sequence[str], score) -> str:
    """The key of ``pool`` with the highest ``score``; on a tie the first (``pool`` is sorted: deterministic)."""
    best, best_score = None, None
    for key in pool:
        sc = score(key)
        if best_score is None or sc > best_score:
            best, best_score = key, sc
    return best


# the options that only reorder the pool (bonuses and weights of the rank order): the "simpler" axis of the one-SE
# rule, and what cost points share (a pool weight changes what the loop reads only through what it ranks first)
ORDER_WEIGHTS = ("retrieval_weight", "requery_weight", "link_weight", "backlink_weight")


def cands_config(cands: Mapping[str, Candidates], key: str) -> dict:
    return next(iter(cands.values())).rows[key]["config"]


def structure(config: Mapping[str, Any]) -> str:
    """A config's options but its pool weights (:data:`ORDER_WEIGHTS`): its cost point and loop shape."""
    return config_key({k: v for k, v in config.items() if k not in ORDER_WEIGHTS})


def complexity(config: Mapping[str, Any]) -> tuple[int, float]:
    """How far a config's pool weights are from off (the loop's defaults): how many are on, then their total
    distance from the default. Fewer and smaller bonuses are simpler."""
    from effrag.pipelines.efficientrag.config import EfficientRAGConfig

    default = EfficientRAGConfig()
    away = [abs(float(config[k]) - float(getattr(default, k))) for k in ORDER_WEIGHTS
            if config.get(k) is not None and float(config[k]) != float(getattr(default, k))]
    return len(away), round(sum(away), 9)


def simplest_within_se(cands: Mapping[str, Candidates], members: Mapping[str, Sequence[int]],
                       budgets: Sequence[int], pool: Sequence[str], score) -> str:
    """The one-standard-error rule over ``pool``: the configs whose mean recall (over ``budgets``, per member
    question of every dataset) is within one standard error of the per-question difference to the best config's;
    of those the simplest (:func:`complexity`), then the best ``score``, then the first key.

    Why: on a small dev file the best of many near-equal configs is partly the one that fits its questions' noise
    (on MuSiQue's 126 questions two of five folds chose a link bonus that hurt their held-out fold); a config that
    is as good within the noise and has fewer parts carries over better."""
    within = within_se(cands, members, budgets, pool, score)
    return _simplest(cands, within, score)


def _simplest(cands: Mapping[str, Candidates], keys: Sequence[str], score) -> str:
    """The simplest of ``keys`` (:func:`complexity`), then the best ``score``, then the first key."""
    return min(keys, key=lambda k: (complexity(cands_config(cands, k)), [-x for x in score(k)], k))


def within_se(cands: Mapping[str, Candidates], members: Mapping[str, Sequence[int]], budgets: Sequence[int],
              pool: Sequence[str], score) -> list[str]:
    """The keys of ``pool`` whose mean recall (over ``budgets``, per member question of every dataset) is within one
    standard error of the per-question difference to the best config's (the best included)."""
    best = _top(pool, score)

    def per_question(key: str) -> list[float]:
        return [sum(cands[d].scores[key][b][i][0] for b in budgets) / len(budgets) for d in cands for i in members[d]]

    top = per_question(best)
    return [key for key in pool if _within_one_se(per_question(key), top)]


def _within_one_se(mine: Sequence[float], top: Sequence[float]) -> bool:
    """Whether per-question scores ``mine`` are, on average, within one standard error of the per-question difference
    to ``top``."""
    diff = [m - t for m, t in zip(mine, top)]
    return sum(diff) / len(diff) >= -standard_error(diff) - 1e-12


def cheapest_within_se(cands: Mapping[str, Candidates], members: Mapping[str, Sequence[int]],
                       budgets: Sequence[int], pool: Sequence[str], score, inner: int = 5, seed: int = 0) -> str:
    """Recall first, cost breaks ties (issue #67). Every cost point (:func:`structure`: a config's options but its
    pool weights) competes on its *cross-fitted* recall over the member questions: ``inner`` folds of them, each
    scored by the point's best-recall pool weights chosen on the other inner folds. Of the points within one standard
    error (per-question difference) of the best one's, the cheapest (mean reading cost of its configs on the
    members), then the first; the config returned is that point's best recall on every member.

    Why cross-fitted: a point's in-sample recall is the best of its pool weightings (72 in the recipe's grid), so it
    fits its choosing questions; compared in-sample, points differ by their fit as much as by their recall. Called
    from :func:`crossfit` on each outer fold's choosing questions, the whole rule is nested: no question scores a
    choice it took part in (``reports/efficientrag/ship-for-recall/selection.md``)."""
    by_point: dict[str, list[str]] = {}
    for key in pool:
        by_point.setdefault(structure(cands_config(cands, key)), []).append(key)
    if len(by_point) == 1:
        return _top(pool, score)
    inner_fold = {d: folds([cands[d].ids[i] for i in members[d]], min(inner, len(members[d])), seed)
                  for d in cands}

    def held_out(keys: Sequence[str]) -> list[float]:
        """Per member question (datasets in order), the mean recall over ``budgets`` of the config the other inner
        folds chose among ``keys``."""
        out = {d: {} for d in cands}
        for f in range(inner):
            train = {d: [i for i in members[d] if inner_fold[d][cands[d].ids[i]] != f] for d in cands}
            test = {d: [i for i in members[d] if inner_fold[d][cands[d].ids[i]] == f] for d in cands}
            if not any(test.values()):
                continue
            key = _top(keys, _score_on(cands, train, budgets))
            for d in cands:
                for i in test[d]:
                    out[d][i] = sum(cands[d].scores[key][b][i][0] for b in budgets) / len(budgets)
        return [out[d][i] for d in cands for i in members[d]]

    recall = {point: held_out(keys) for point, keys in by_point.items()}
    best = max(sorted(by_point), key=lambda point: sum(recall[point]))
    within = [point for point in sorted(by_point) if _within_one_se(recall[point], recall[best])]

    def point_cost(point: str) -> float:
        keys = by_point[point]
        per_key = [sum(cands[d].read_cost(key, members[d]) for d in cands) / len(cands) for key in keys]
        return round(sum(per_key) / len(per_key), 9)

    point = min(within, key=lambda pt: (point_cost(pt), pt))
    return _top(by_point[point], score)


def _score_on(cands: Mapping[str, Candidates], members: Mapping[str, Sequence[int]], budgets: Sequence[int]):
    """:func:`_best`'s score (mean recall over ``budgets`` and datasets, fewer chunks on a tie) on ``members``."""
    def score(key: str) -> tuple[float, float]:
        rec, ch = zip(*(cands[d].mean(key, b, members[d]) for d in cands for b in budgets if members[d]))
        return round(sum(rec) / len(rec), 12), -sum(ch) / len(ch)
    return score


def strongest(by_kind: Mapping[str, Mapping[str, float]], ids: Sequence[str]) -> Mapping[str, float]:
    """The per-question recall of the baseline with the best mean over ``ids`` (``by_kind``: kind -> recall per
    question id)."""
    if not ids:
        raise ValueError("a floor over no questions")
    missing = [q for q in ids if any(q not in r for r in by_kind.values())]
    if missing:
        raise ValueError(f"no baseline recall for question {missing[0]!r}")
    return max(by_kind.values(), key=lambda r: sum(r[q] for q in ids))


def floor(by_kind: Mapping[str, Mapping[str, float]], ids: Sequence[str]) -> float:
    """The strongest baseline's mean recall over ``ids``."""
    best = strongest(by_kind, ids)
    return sum(best[q] for q in ids) / len(ids)


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (0 for fewer than two)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5


def crossfit(rows_by_dataset: Mapping[str, Iterable[dict]], budgets: Sequence[int] = (7, 10), k: int = 5,
             seed: int = 0, caps: Sequence[int] = CAPS, exclude: Iterable[str] = (),
             floors: Mapping | None = None, margin: float | str = 0.0,
             ranker_factors: Mapping[str, float | Mapping[str, float]] | None = None,
             prefer: str = "recall") -> dict[str, Any]:
    """Cross-fitted recall of the tuning protocol at each budget, and the held-out curve of the chosen configs.

    ``rows_by_dataset``: one tuning folder's rows per dataset (one dataset = per-dataset configs; several =
    one joint config). ``exclude``: question ids left out of every fold (e.g. questions the quickstart shows).
    Returns ``{"budgets", "k", "seed", "datasets": {name: {"recall": {b: r}, "avg_chunks": {b: c}, "curve":
    [[cap, recall, chunks], ...], "n", "forwards"}}, "folds": [{"fold", "config", "chosen_on", "scored_on"}]}``;
    each fold's config was chosen on the other folds (of every dataset). ``forwards`` is the held-out
    questions' mean reading cost, [Labeler pairs, ranker pairs, Filter inputs]. ``floors`` and ``margin``: the
    cheapest-that-keeps-the-bar rule of :func:`_best`, each fold's floors on its own choosing questions.
    ``ranker_factors``: per dataset, a ranker read's cost against a Labeler read, or one per ranker folder a row's
    config names (:func:`ranker_factor_of`; default 1). ``prefer``: :func:`_best`'s final choice. Each fold
    entry also holds its config's recall at each budget on the questions that chose it (``in_sample``) and on
    the fold (``held_out``): their difference is how much the choice fitted its own questions.
    """
    cands = {d: Candidates(rows, caps, (ranker_factors or {}).get(d, 1.0)) for d, rows in rows_by_dataset.items()}
    skip = set(exclude)
    fold_of = {d: folds([q for q in c.ids if q not in skip], k, seed) for d, c in cands.items()}
    held: dict[str, dict[int, list[tuple[float, float]]]] = {d: {c: [] for c in caps} for d in cands}
    read: dict[str, list[list[float]]] = {d: [] for d in cands}
    chosen = []
    for f in range(k):
        train = {d: [i for i, q in enumerate(c.ids) if q in fold_of[d] and fold_of[d][q] != f] for d, c in cands.items()}
        test = {d: [i for i, q in enumerate(c.ids) if q in fold_of[d] and fold_of[d][q] == f] for d, c in cands.items()}
        key = _best(cands, train, budgets, floors, margin, prefer)
        chosen.append({"fold": f, "config": next(iter(cands.values())).config(key, max(budgets)),
                       "chosen_on": {d: len(v) for d, v in train.items()},
                       "scored_on": {d: len(v) for d, v in test.items()},
                       "in_sample": {d: {b: c.mean(key, b, train[d])[0] for b in budgets} for d, c in cands.items()},
                       "held_out": {d: {b: c.mean(key, b, test[d])[0] for b in budgets} for d, c in cands.items()}})
        for d, c in cands.items():
            for cap in caps:
                held[d][cap] += [c.scores[key][cap][i] for i in test[d]]
            read[d] += [c.cost[key][i] for i in test[d]]
    out = {}
    for d, by_cap in held.items():
        n = len(read[d])
        curve = [[cap, sum(r for r, _ in v) / n, sum(ch for _, ch in v) / n] for cap, v in by_cap.items()]
        at = {cap: (r, ch) for cap, r, ch in curve}
        out[d] = {"recall": {b: at[b][0] for b in budgets}, "avg_chunks": {b: at[b][1] for b in budgets},
                  "curve": curve, "n": n, "forwards": [sum(x[j] for x in read[d]) / n for j in range(3)]}
    return {"budgets": list(budgets), "k": k, "seed": seed, "datasets": out, "folds": chosen}


def choose(rows_by_dataset: Mapping[str, Iterable[dict]], budgets: Sequence[int] = (7, 10),
           caps: Sequence[int] = CAPS, exclude: Iterable[str] = (), floors: Mapping | None = None,
           margin: float | str = 0.0,
           ranker_factors: Mapping[str, float | Mapping[str, float]] | None = None,
           prefer: str = "recall") -> dict[str, Any]:
    """The config chosen on every question but ``exclude`` (to ship), with its in-sample recall (not held out)."""
    cands = {d: Candidates(rows, caps, (ranker_factors or {}).get(d, 1.0)) for d, rows in rows_by_dataset.items()}
    skip = set(exclude)
    members = {d: [i for i, q in enumerate(c.ids) if q not in skip] for d, c in cands.items()}
    key = _best(cands, members, budgets, floors, margin, prefer)
    return {"config": next(iter(cands.values())).config(key, max(budgets)),
            "chosen_on": {d: len(m) for d, m in members.items()},
            "in_sample": {d: {b: cands[d].mean(key, b, members[d])[0] for b in budgets} for d in cands}}
