"""Whether a loop config ships with the set-wise pool ranker (``set_ranker_top``), decided by the shipping rule.

The evidence is one row per dev question and pool order: ``{"id", "dump", "curves": {order: [recall at 1..10]}}``,
where ``pool`` is the loop's own order and ``<model>@<M>`` the set-wise model over the order's first M
(``scripts/set_ranker.py score``). A *unit* is the dumps one config is chosen on: one dataset for
``loop-<dataset>.json``, the three together for ``loop.json``.

The rule is the shipping rule of the loop configs (:func:`effrag.tuning.crossfit.crossfit`): the best recall
averaged over the budgets (7 and 10) and the unit's datasets; ``pool`` wins a tie. Its figure is cross-fitted:
5 folds (seed 0), each fold's order chosen on the other four. A config gains ``set_ranker_top`` only when the
order picked on all the questions is a model order *and* the procedure's cross-fitted recall beats the pool's:
a pick the folds do not agree on is a pick of noise.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .crossfit import folds

RULE_BUDGETS = (7, 10)
SHOW_BUDGETS = (5, 7, 10)


def group_rows(rows: Iterable[Mapping[str, Any]], exclude: Iterable[str] = ()) -> dict[str, list[dict]]:
    """Evidence rows by dump name (``hotpotqa-dev-own``), the ``exclude`` question ids left out."""
    skip, out = set(exclude), {}
    for r in rows:
        if r["id"] not in skip:
            out.setdefault(str(r["dump"]).removesuffix(".jsonl"), []).append(dict(r))
    return out


def _mean(rows: Sequence[Mapping], order: str, budget: int, idx: Iterable[int]) -> float:
    idx = list(idx)
    return sum(rows[i]["curves"][order][budget - 1] for i in idx) / max(len(idx), 1)


def choose_order(groups: Mapping[str, Sequence[Mapping]], unit: Sequence[str], orders: Sequence[str],
                 members: Mapping[str, Sequence[int]], rule: Sequence[int] = RULE_BUDGETS) -> str:
    """The order with the best recall averaged over ``rule`` and the unit's dumps on ``members``; pool on a tie."""
    def score(o: str) -> tuple[float, bool]:
        return (round(sum(_mean(groups[g], o, b, members[g]) for g in unit for b in rule) / (len(unit) * len(rule)),
                      12), o == "pool")
    return max(orders, key=score)


def evaluate_unit(groups: Mapping[str, Sequence[Mapping]], unit: Sequence[str], rule: Sequence[int] = RULE_BUDGETS,
                  show: Sequence[int] = SHOW_BUDGETS, k: int = 5, seed: int = 0) -> dict[str, Any]:
    """One unit: each fold's pick and the held-out recall, the pick on all questions, every order's in-sample
    recall, and the decision (``ships``: the order that ships, ``top``: its M, 0 for the pool)."""
    if not unit or any(not groups.get(g) for g in unit):
        raise ValueError(f"no questions to decide on for {' + '.join(unit) or 'an empty unit'}")
    orders = list(groups[unit[0]][0]["curves"])
    fold_of = {g: folds([r["id"] for r in groups[g]], k, seed) for g in unit}
    held: dict[str, dict[int, list[float]]] = {g: {b: [] for b in show} for g in unit}
    picks = []
    for f in range(k):
        train = {g: [i for i, r in enumerate(groups[g]) if fold_of[g][r["id"]] != f] for g in unit}
        pick = choose_order(groups, unit, orders, train, rule)
        picks.append(pick)
        for g in unit:
            for b in show:
                held[g][b] += [r["curves"][pick][b - 1] for r in groups[g] if fold_of[g][r["id"]] == f]
    everyone = {g: range(len(groups[g])) for g in unit}
    final = choose_order(groups, unit, orders, everyone, rule)
    crossfit = {g: {b: sum(v) / len(v) for b, v in held[g].items()} for g in unit}
    in_sample = {g: {o: {b: _mean(groups[g], o, b, everyone[g]) for b in show} for o in orders} for g in unit}
    mine = sum(crossfit[g][b] for g in unit for b in rule)
    pool = sum(in_sample[g]["pool"][b] for g in unit for b in rule)
    ships = final if final != "pool" and mine > pool + 1e-12 else "pool"
    return {"unit": list(unit), "rule": list(rule), "fold_picks": picks, "pick": final, "ships": ships,
            "top": int(ships.rsplit("@", 1)[1]) if ships != "pool" else 0,
            "n": {g: len(groups[g]) for g in unit}, "crossfit": crossfit, "in_sample": in_sample}


def set_ranker_record(decision: Mapping[str, Any], report: str) -> dict[str, Any]:
    """What a loop config file records of the decision: the rule, the folds' picks, and the figures."""
    r3 = lambda v: round(v, 4)  # noqa: E731
    return {"top": decision["top"], "rule": "best recall averaged over the budgets " + ", ".join(
                map(str, decision["rule"])) + "; ships only where its cross-fitted recall beats the pool order's",
            "fold_picks": decision["fold_picks"], "pick": decision["pick"],
            "n": decision["n"],
            "crossfit": {g: {str(b): r3(v) for b, v in d.items()} for g, d in decision["crossfit"].items()},
            "pool": {g: {str(b): r3(v) for b, v in d["pool"].items()} for g, d in decision["in_sample"].items()},
            "report": report}


def apply_decision(loop_file: Mapping[str, Any], decision: Mapping[str, Any], report: str) -> dict[str, Any]:
    """A loop config file's JSON with the decision applied: ``set_ranker_top`` in its config when the set ranker
    ships, absent otherwise, and the ``set_ranker`` record either way."""
    out = dict(loop_file)
    config = {k: v for k, v in out["config"].items() if k != "set_ranker_top"}
    if decision["top"]:
        config["set_ranker_top"] = decision["top"]
    out["config"] = config
    out["set_ranker"] = set_ranker_record(decision, report)
    return out
