"""The lead a shipped pick keeps over the strongest plain retriever once its own fit to the choosing questions is
taken off (issue #67).

A config chosen on some questions scores higher on them than on questions it never saw: the cross-fitted *gap*
(the mean over folds of the chosen config's recall on its choosing questions minus its recall on the held-out fold)
measures how much. A lead over the strongest Direct-R that survives unseen questions must therefore be at least
one standard error of the per-question difference *after* that gap:

    lead in-sample - max(gap, 0) >= SE(per-question difference to the strongest Direct-R)

:func:`margins` computes it per budget for one dataset's shipped pick, from the same rows and per-question
baselines the pick was chosen from, so a report can say where the lead is within the noise.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .crossfit import Candidates, standard_error, strongest


def _key_of(cands: Candidates, config: Mapping[str, Any], cap: int) -> str:
    for key in cands.rows:
        if cands.config(key, cap) == dict(config):
            return key
    raise ValueError("the pick is not among the tuning rows it was chosen from")


def margins(rows: Sequence[dict], config: Mapping[str, Any], held: Mapping[str, Any], dataset: str,
            bars: Mapping[int, Mapping[str, Mapping[str, float]]], targets: Mapping[int, int],
            exclude: Sequence[str] = (), ranker_factor: float | Mapping[str, float] = 1.0) -> dict[int, dict]:
    """Per budget ``b`` (those of ``held`` with a bar): the pick's lead over the strongest Direct-R@``targets[b]``
    on the questions that chose it, the standard error of the per-question difference, the cross-fitted gap
    (``held``: :func:`.crossfit.crossfit`'s result of the rule that chose ``config``), the margin needed (gap +
    SE), the held-out lead, and whether the lead survives.

    ``bars``: budget -> baseline kind -> recall per question id (at the budget's target depth)."""
    cands = Candidates(rows, ranker_factor=ranker_factor)
    skip = set(exclude)
    members = [i for i, q in enumerate(cands.ids) if q not in skip]
    ids = [cands.ids[i] for i in members]
    budgets = [b for b in held["budgets"] if b in bars]
    key = _key_of(cands, config, max(held["budgets"]))
    out = {}
    for b in budgets:
        base = strongest(bars[b], ids)
        kind = next(kd for kd, r in bars[b].items() if r is base)
        diff = [cands.scores[key][b][i][0] - base[q] for i, q in zip(members, ids)]
        lead = sum(diff) / len(diff)
        se = standard_error(diff)
        folds = held["folds"]
        gap = sum(f["in_sample"][dataset][b] - f["held_out"][dataset][b] for f in folds) / len(folds)
        bar = sum(base[q] for q in ids) / len(ids)
        held_lead = held["datasets"][dataset]["recall"][b] - bar
        out[b] = {"target": targets[b], "bar": kind, "bar_recall": bar, "lead_in_sample": lead, "se": se,
                  "gap": gap, "margin_needed": max(gap, 0.0) + se, "lead_held_out": held_lead,
                  "keeps": lead - max(gap, 0.0) >= se - 1e-12}
    return out
