"""The loop configs a system ships, chosen from tuning folders, with their cross-fitted figures beside them.

:func:`write_loop_configs` reads one tuning folder per dev file (the same grid, ``per_question`` rows) and
writes into a system folder ``loop-<dataset>.json`` (chosen on that dataset's dev questions) and ``loop.json``
(one config chosen jointly on all of them: what a user with their own corpus and no dev file gets). Each
file records the retriever it was tuned for, which questions chose it, and the cross-fitted recall of the
same protocol (:mod:`.crossfit`): the figure to quote, never the in-sample one.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .crossfit import choose, config_key, crossfit, ranker_factor_of
from .loop_cost import cost_point, read_cost


def read_rows(folder: str | Path) -> list[dict]:
    """The rows of a tuning folder's ``results.jsonl``; rows without per-question scores are refused."""
    from ..jsonl import numbered_jsonl

    path = Path(folder) / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no tuning results (run scripts/tune_efficientrag.py --output {folder})")
    rows = [row for _, row in numbered_jsonl(path)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def portable_setup(setup: Mapping[str, Any]) -> dict[str, Any]:
    """A tuning setup without machine paths: data files as ``<dataset>/<split>.jsonl``, model and encoder folders
    by name (the run identity's corpus and index sources too)."""
    out = dict(setup)
    for key in ("questions", "corpus"):
        if out.get(key):
            out[key] = "/".join(Path(out[key]).parts[-2:])
    if out.get("corpus_from"):
        out["corpus_from"] = ["/".join(Path(f).parts[-2:]) for f in out["corpus_from"]]
    for key in ("labeler", "filter", "ranker", "encoder", "index"):
        if out.get(key):
            out[key] = Path(out[key]).name
    return out


def _describe(res: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    d = res["datasets"][dataset]
    return {"recall": {str(b): round(r, 4) for b, r in d["recall"].items()}, "n": d["n"],
            "forwards": [round(x, 2) for x in d["forwards"]], "folds": res["k"], "seed": res["seed"]}


def write_loop_configs(tunes: Mapping[str, str | Path | list], system: str | Path, *, budgets: Sequence[int] = (7, 10),
                       k: int = 5, seed: int = 0, exclude: Iterable[str] = (), floors: Mapping | None = None,
                       margin: float | str = 0.0,
                       ranker_factors: Mapping[str, float | Mapping[str, float]] | None = None,
                       prefer: str = "recall", fall_back: bool = False,
                       bars: Mapping | None = None, targets: Mapping[int, int] | None = None,
                       over: str | None = None) -> dict[str, Any]:
    """Choose and write ``loop-<dataset>.json`` and ``loop.json`` into ``system``; returns every figure.

    ``exclude``: question ids that choose nothing and are scored in no fold (the quickstart's bundled
    questions, so that what it shows was never used to choose a setting). ``floors`` (dataset -> budget ->
    baseline -> recall per question id) and ``margin``: choose the cheapest config that keeps the bar
    (:func:`.crossfit._best`) instead of the best recall. ``tunes``: per dataset a tuning folder or its rows
    (e.g. from :func:`.evidence.read_evidence`); ``ranker_factors``: per dataset, a ranker read against a Labeler
    read (default: from the model folders the setups name). ``prefer="simple"``: the one-standard-error rule
    (:func:`.crossfit.simplest_within_se`) makes the final choice; ``prefer="cheap"``: recall first, the cheapest
    cost point within one standard error (:func:`.crossfit.cheapest_within_se`).

    ``fall_back``: where a dataset's own rule does not beat ``loop.json``'s cross-fitted recall on that dataset
    (mean over ``budgets``), ``loop-<dataset>.json`` ships ``loop.json``'s config and figures and says so. ``bars``
    (as ``floors``) and ``targets`` (budget -> Direct-R depth): each shipped pick's lead after its cross-fitted gap
    (:func:`.margin.margins`), in the report's ``margins``. ``over``: what the rows were tuned over, recorded in each
    file's ``chosen_on`` (e.g. which report chose which of the options).
    """
    rows = {d: f if isinstance(f, list) else read_rows(f) for d, f in tunes.items()}
    skip = sorted(set(exclude))
    setups = {d: r[0]["setup"] for d, r in rows.items()}
    kinds = {s.get("retriever") for s in setups.values()}
    if len(kinds) != 1:
        raise ValueError(f"the tuning folders used different retrievers {sorted(map(str, kinds))}: one system, one retriever")
    retriever = kinds.pop()
    from effrag.models.encoders import encoder_alias

    encoders = {encoder_alias(s.get("encoder")) or s.get("encoder") for s in setups.values()}
    if len(encoders) != 1:
        raise ValueError(f"the tuning folders used different encoders {sorted(map(str, encoders))}: one system, one "
                         "encoder")
    # by alias (a config holds no machine path); a folder that is no packaged encoder is not named, as before
    encoder = encoder_alias(encoders.pop()) if retriever in ("dense", "hybrid", "milvus") else None
    out = Path(system)
    report: dict[str, Any] = {"budgets": list(budgets), "k": k, "seed": seed, "retriever": retriever,
                              "encoder": encoder,
                              "excluded": len(skip), "per_dataset": {}, "general": {}}
    factors = dict(ranker_factors) if ranker_factors is not None else {d: setup_ranker_factor(s)
                                                                         for d, s in setups.items()}
    rule = {"floors": floors, "margin": margin, "ranker_factors": factors, "prefer": prefer}
    report["ranker_factors"] = factors
    report["rule"] = ("cheapest that keeps the bar" if floors is not None else "best recall", margin, prefer)
    general_held = crossfit(rows, budgets, k=k, seed=seed, exclude=skip, **rule)
    general = choose(rows, budgets, exclude=skip, **rule)
    report["general"] = {"crossfit": general_held, "chosen": general}
    joint_on = f"the dev questions of {', '.join(rows)} jointly (mean recall), but the bundled sample's"
    for d, r in rows.items():
        own = {**rule, "floors": None if floors is None else {d: floors[d]}}
        held = crossfit({d: r}, budgets, k=k, seed=seed, exclude=skip, **own)
        pick = choose({d: r}, budgets, exclude=skip, **own)
        mean = lambda res: sum(res["datasets"][d]["recall"][b] for b in budgets) / len(budgets)  # noqa: E731
        ships = "loop.json" if fall_back and mean(held) <= mean(general_held) else "own"
        report["per_dataset"][d] = {"crossfit": held, "chosen": pick, "ships": ships,
                                    "own_recall": mean(held), "general_recall": mean(general_held)}
        if ships == "own":
            _write(out / f"loop-{d}.json", pick, (retriever, encoder), {d: _describe(held, d)},
                   f"{d} dev questions but the bundled sample's", portable_setup(_setup_of(r, pick["config"])),
                   report["rule"], over)
        else:  # the dataset's own rule did not beat loop.json's on its questions, held out: loop.json's pick ships
            why = (f"loop.json's config, shipped for {d}: the {d} rule's cross-fitted recall at "
                   f"{' / '.join(map(str, budgets))} chunks ({_pct(held, d, budgets)}) did not beat loop.json's on "
                   f"the same questions ({_pct(general_held, d, budgets)}); chosen on {joint_on}")
            _write(out / f"loop-{d}.json", {**general, "in_sample": {d: general["in_sample"][d]}},
                   (retriever, encoder), {d: _describe(general_held, d)}, why,
                   portable_setup(_setup_of(r, general["config"])), report["rule"], over)
        if bars is not None and targets:
            from .margin import margins

            shipped, res = (pick, held) if ships == "own" else (general, general_held)
            report["per_dataset"][d]["margins"] = margins(
                r, shipped["config"], res, d, bars[d], targets, skip, factors.get(d, 1.0))
            report["general"].setdefault("margins", {})[d] = margins(
                r, general["config"], general_held, d, bars[d], targets, skip, factors.get(d, 1.0))
    _write(out / "loop.json", general, (retriever, encoder), {d: _describe(general_held, d) for d in rows},
           joint_on, {d: portable_setup(_setup_of(r, general["config"])) for d, r in rows.items()}, report["rule"], over)
    return report


def _pct(res: Mapping[str, Any], d: str, budgets: Sequence[int]) -> str:
    return " / ".join(f"{100 * res['datasets'][d]['recall'][b]:.1f}" for b in budgets)


def _setup_of(rows: list[dict], config: Mapping[str, Any]) -> dict:
    """The setup of the tuning folder the chosen config's row came from (rows of several rankers carry each its own
    ranker and model fingerprints)."""
    key = config_key(config)
    return next((r["setup"] for r in rows if config_key(r["config"]) == key), rows[0]["setup"])


def _write(path: Path, pick: Mapping[str, Any], searcher: tuple, crossfitted: Mapping[str, Any], chosen_on: str,
           setup: Any, rule: tuple, over: str | None = None) -> None:
    """``searcher``: the retriever kind and the encoder alias (None: no dense leg) the rows were tuned over."""
    retriever, encoder = searcher
    how = "best recall: the config with the best recall averaged over the budgets (fewer chunks on a tie)" \
        if rule[0] == "best recall" else \
        f"{rule[0]}: the strongest Direct-R's recall on the same questions + " + (
            "one standard error of the per-question difference" if rule[1] == "se" else f"{100 * rule[1]:g} points")
    if len(rule) > 2 and rule[2] == "cheap":
        how += (": " if rule[0] == "best recall" else "; ") + ("of the configs within one standard error of the "
                "best recall (per-question difference), the cheapest cost point, then its simplest pool weights")
    if len(rule) > 2 and rule[2] == "simple":
        how += ("; of those (the cheapest one's options but the pool weights), " if rule[0] != "best recall" else
                ": ") + "the simplest config whose recall is within one standard error of the best's"
    config = dict(pick["config"])
    ranker = config.pop("ranker", None)  # which of the system's rankers: the file's, not a loop option
    from ..state_files import write_text_atomic

    write_text_atomic(path, json.dumps({
        "config": config, "retriever": retriever, **({"encoder": encoder} if encoder else {}),
        **({"ranker": ranker} if ranker and ranker != "ranker" else {}),
        "chosen_on": {"questions": chosen_on, "n": pick["chosen_on"], "rule": how, **({"over": over} if over else {})},
        "crossfit": crossfitted,
        "in_sample_recall": {d: {str(b): round(v, 4) for b, v in r.items()} for d, r in pick["in_sample"].items()},
        "setup": setup,
    }, indent=2) + "\n")


def setup_ranker_factor(setup: Mapping[str, Any]) -> float:
    """A tuning folder's ranker read against its Labeler read (:func:`.loop_cost.ranker_read_factor`), from the
    model folders its setup names; 1.0 when they are not at hand."""
    from .loop_cost import ranker_read_factor

    if not setup.get("ranker") or not setup.get("labeler"):
        return 1.0
    return ranker_read_factor(setup["ranker"], setup["labeler"])


def cost_curve(rows: list[dict], *, k: int = 5, seed: int = 0, exclude=(), budgets=(7, 10),
               shown=(5, 7, 10), ranker_factor: float | Mapping[str, float] = 1.0) -> list[dict]:
    """One dataset's Pareto rows: for each cost point of a tuning folder's rows, the cross-fitted recall at ``shown``
    chunks of the best-recall rule restricted to that point's configs (the other options, e.g. the pool weights,
    still chosen on the other folds), with the held-out questions' reads per model and :func:`read_cost`."""
    import json

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps(cost_point(r["config"]), sort_keys=True), []).append(r)
    out = []
    for key, members in groups.items():
        res = crossfit({"d": members}, budgets, k=k, seed=seed, exclude=exclude,
                       ranker_factors={"d": ranker_factor})["datasets"]["d"]
        at = {cap: rec for cap, rec, _ in res["curve"]}
        point = json.loads(key)
        out.append({"point": point, "recall": {c: at[c] for c in shown}, "reads": res["forwards"],
                    "read_cost": read_cost(point, res["forwards"], ranker_factor_of(point, ranker_factor)),
                    "n": res["n"], "configs": len(members)})
    return sorted(out, key=lambda r: -r["read_cost"])
