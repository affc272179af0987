#!/usr/bin/env python
"""EfficientRAG against the strongest plain retriever on the dev files, every EfficientRAG figure cross-fitted.

Reads one tuning folder per dev file (``scripts/tune_efficientrag.py --output DIR``: every config's per-question
pool positions), chooses the configs to ship (``effrag.tuning.loop_configs``: ``loop-<dataset>.json`` per dev file,
``loop.json`` jointly; with ``--system DIR`` they are written there), and writes into ``--output``:

* ``table2.md``: Direct-R with BM25, dense and hybrid at 7 / 10 / 20 / 30 on the same questions, next to
  EfficientRAG with at most 7 and 10 chunks (per-dataset configs and ``loop.json``, both cross-fitted: each
  question scored by a config chosen on the other folds), what the loop read per question, and the targets
  (<= 7 chunks >= the strongest Direct-R@20; <= 10 chunks >= the strongest Direct-R@30);
* ``curve.md`` and ``recall_vs_chunks.png``: recall at 1..10 chunks, EfficientRAG's held-out curve against
  the strongest Direct-R's;
* ``crossfit.json``: every figure, the configs each fold chose, and which questions chose what;
* ``evidence/<dataset>.json.gz``: the per-question rows and Direct-R recalls all of it is computed from
  (``effrag.tuning.evidence``), committed, so that ``--evidence DIR`` rebuilds every table from a fresh clone.

The bundled sample's dev questions (the quickstart's) are left out of every choice and every figure here
(``--keep-sample`` keeps them), so the quickstart shows questions that chose nothing.

    python scripts/efficientrag_report.py --tune hotpotqa=runs/tune/all-hotpotqa 2wikimqa=... musique=... \\
        --data ../shared/data --system checkpoints/efficientrag-all --output reports/efficientrag/dev
    python scripts/efficientrag_report.py --evidence reports/efficientrag/crossfit/evidence --output runs/again
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.evaluation.report import md_table

TABLE_KS = (7, 10, 20, 30)
KINDS = ("bm25", "dense", "hybrid")
PREFER_NAMES = {"recall": "best recall", "simple": "simplest within 1 SE", "cheap": "cheapest within 1 SE"}
TARGETS = {7: 20, 10: 30}  # chunks -> the Direct-R depth EfficientRAG must reach (the default of --targets)
DEFAULT_ENCODER = "minilm"


def kinds_of(direct: dict[str, dict[int, float]]) -> list[str]:
    """The baselines of a dataset's Direct-R table, in order: BM25, then dense and hybrid per encoder."""
    return [kd for kd in direct if not kd.endswith("-own-k")]


def kind_name(kind: str, encoder: str) -> str:
    return kind if encoder == DEFAULT_ENCODER or kind == "bm25" else f"{kind}-{encoder}"


def direct_r(data: Path, dataset: str, skip: set[str], encoders=(DEFAULT_ENCODER,),
             depths=tuple(sorted(set(TARGETS.values())))) -> tuple[dict[str, dict[int, float]], dict]:
    """Direct-R recall at k = 1..30 for each retriever kind, on the dev questions not in ``skip``: the top 30 cut
    at k (``effrag eval --k 1 ... --k 30``); for hybrid, the better of that and fusing each retriever's own top k
    (``effrag eval --retriever hybrid --k K``), so that the baseline is the stronger of the two. Also each
    question's recall at the target ``depths``, per kind (hybrid's two forms apart): the floors the
    cheapest-that-keeps-the-bar rule measures on each fold's own questions. Dense and hybrid run with each of
    ``encoders`` (named ``dense-<encoder>`` but for the default MiniLM), so the bar is the strongest of them all."""
    from effrag.evaluation.metrics import recall
    from effrag.setup import RunSetup

    out, per_q = {}, {}
    for kind, encoder in [("bm25", None)] + [(kd, enc) for enc in encoders for kd in KINDS if kd != "bm25"]:
        run = RunSetup.build(data / dataset / "dev.jsonl", corpus_from=[data / dataset / "train.jsonl"], retriever=kind,
                             bf16=True, encoder=None if encoder in (None, DEFAULT_ENCODER) else encoder)
        kind = kind_name(kind, encoder or DEFAULT_ENCODER)
        keep = [i for i, q in enumerate(run.questions) if q.id not in skip]
        texts, gold = [run.texts[i] for i in keep], [run.gold[i] for i in keep]
        ids = [run.questions[i].id for i in keep]
        ks = range(1, 31)
        top = run.retriever.search(texts, max(ks))
        each = lambda hits: [recall([h.id for h in hs], g) for hs, g in zip(hits, gold)]  # noqa: E731
        out[kind] = {k: sum(each([h[:k] for h in top])) / len(gold) for k in ks}
        per_q[kind] = {k: dict(zip(ids, each([h[:k] for h in top]))) for k in depths}
        if kind.startswith("hybrid"):  # fusing each retriever's own top k can beat the fused top 30 cut at k: the better one
            own = {k: each(run.retriever.search(texts, k)) for k in ks}
            out[kind] = {k: max(v, sum(own[k]) / len(gold)) for k, v in out[kind].items()}
            per_q[f"{kind}-own-k"] = {k: dict(zip(ids, own[k])) for k in depths}
    return out, per_q


def floors_of(per_q: dict, budgets, targets=TARGETS) -> dict:
    """dataset -> budget -> baseline -> recall per question at the budget's target depth (``crossfit`` floors)."""
    return {ds: {b: {kind: by_k[targets[b]] for kind, by_k in kinds.items()} for b in budgets if b in targets}
            for ds, kinds in per_q.items()}


def strongest(direct: dict[str, dict[int, float]], k: int) -> tuple[str, float]:
    kind = max(kinds_of(direct), key=lambda kd: direct[kd][k])
    return kind, direct[kind][k]


def shipped_held(report: dict, ds: str) -> dict:
    """The cross-fitted figures of what ``loop-<ds>.json`` ships: its own rule's, or loop.json's where that one
    ships for the dataset (``--fall-back``)."""
    own = report["per_dataset"][ds]
    return (report["general"] if own.get("ships") == "loop.json" else own)["crossfit"]["datasets"][ds]


def table2(report: dict, direct: dict, budgets, targets=TARGETS) -> str:
    kinds = kinds_of(next(iter(direct.values())))
    head = ["dataset (questions)", *(f"{kd} @{k}" for kd in kinds for k in TABLE_KS),
            *(f"EfficientRAG <= {b}, loop-<dataset>.json" for b in budgets),
            *(f"EfficientRAG <= {b}, loop.json" for b in budgets), "read per question (Labeler / ranker / Filter)",
            *(f"target <= {b} chunks vs strongest @{targets[b]}" for b in budgets if b in targets)]
    rows = []
    for ds, dr in direct.items():
        own = shipped_held(report, ds)
        gen = report["general"]["crossfit"]["datasets"][ds]
        cells = [f"{ds} ({own['n']})" + (" (ships loop.json)" if report["per_dataset"][ds].get("ships") == "loop.json"
                                         else ""), *(f"{100 * dr[kd][k]:.1f}" for kd in kinds for k in TABLE_KS)]
        cells += [f"**{100 * own['recall'][b]:.1f}**" for b in budgets]
        cells += [f"{100 * gen['recall'][b]:.1f}" for b in budgets]
        cells.append(" / ".join(f"{x:.1f}" for x in own["forwards"]))
        for b in budgets:
            if b in targets:
                kind, bar = strongest(dr, targets[b])
                best = max(own["recall"][b], gen["recall"][b])
                cells.append(f"{'met' if own['recall'][b] >= bar else 'missed'} ({100 * (own['recall'][b] - bar):+.1f} "
                             f"vs {kind} {100 * bar:.1f}; loop.json {100 * (gen['recall'][b] - bar):+.1f})"
                             if best is not None else "-")
        rows.append(cells)
    return md_table(head, rows, "l" + "r" * (len(head) - 1))


def curve(report: dict, direct: dict) -> tuple[str, list[dict]]:
    rows, plot = [], []
    for ds, dr in direct.items():
        own = shipped_held(report, ds)["curve"]
        gen = report["general"]["crossfit"]["datasets"][ds]["curve"]
        best = [strongest(dr, k) for k in range(1, 11)]
        rows.append([f"{ds}: strongest Direct-R@k", *(f"{100 * v:.1f} ({kd})" for kd, v in best)])
        rows.append([f"{ds}: EfficientRAG, loop-{ds}.json", *(f"{100 * r:.1f}" for _, r, _ in own)])
        rows.append([f"{ds}: EfficientRAG, loop.json", *(f"{100 * r:.1f}" for _, r, _ in gen)])
        for k in range(1, 31):
            kind, v = strongest(dr, k)
            plot.append({"method": "Direct-R, strongest retriever at each k", "dataset": ds, "recall": v,
                         "avg_chunks": float(k)})
        for name, series in (("EfficientRAG loop-<dataset>.json (cross-fitted)", own),
                             ("EfficientRAG loop.json (cross-fitted)", gen)):
            plot += [{"method": name, "dataset": ds, "recall": r, "avg_chunks": ch} for _, r, ch in series]
    return md_table(["", *(str(k) for k in range(1, 11))], rows, "l" + "r" * 10), plot


def pareto_table(tunes: dict, direct: dict, k: int, seed: int, skip, factors: dict) -> tuple[str, dict]:
    """Each dataset's cost points (``effrag.tuning.loop_cost.cost_curve``): reads per model, the reading cost in
    trained-length pair reads, and the cross-fitted recall at 5 / 7 / 10 of the best-recall choice within that
    point, beside the strongest Direct-R@20 and @30."""
    from effrag.tuning.loop_configs import cost_curve

    rows, data = [], {}
    for ds, tuned in tunes.items():
        curve = cost_curve(tuned, k=k, seed=seed, exclude=skip, ranker_factor=factors[ds])
        data[ds] = curve
        bars = {t: strongest(direct[ds], t) for t in TARGETS.values()}
        for c in curve:
            rows.append([ds, c["point"].get("ranker", "ranker"),
                         ", ".join(f"{n} {v}" for n, v in c["point"].items() if n != "ranker"),
                         " / ".join(f"{x:.1f}" for x in c["reads"]), f"{c['read_cost']:.1f}",
                         *(f"{100 * c['recall'][b]:.1f}" for b in (5, 7, 10)),
                         *(("yes" if c["recall"][b] >= bars[TARGETS[b]][1] else "no") for b in (7, 10))])
    head = ["dataset", "ranker", "cost point", "read/q (Labeler / ranker / Filter)", "pair reads/q", "R@5", "R@7",
            "R@10", "@7 >= strongest @20", "@10 >= strongest @30"]
    return md_table(head, rows, "llllrrrrll"), data


def selection_table(tunes: dict, floors: dict | None, margin, factors: dict, budgets, k: int, seed: int,
                    skip) -> tuple[str, list[dict]]:
    """How much each selection rule fits its own questions: for the best-recall rule and (with ``floors``) the
    cheapest-that-keeps-the-bar rule, each with its final choice by best recall and by the one-standard-error
    rule (``prefer="simple"``), per dataset and jointly: the held-out recall (cross-fitted), the mean over folds of
    the chosen config's recall on its own choosing questions, their gap, and how many distinct configs the folds
    chose."""
    from effrag.tuning.crossfit import crossfit

    rules = [("best recall", None)] + ([("cheapest that keeps the bar", floors)] if floors is not None else [])
    scopes = [(ds, {ds: rows}) for ds, rows in tunes.items()] + ([("loop.json", tunes)] if len(tunes) > 1 else [])
    rows, data = [], []
    for scope, rowset in scopes:
        for name, fl in rules:
            for prefer in ("recall", "simple") + (("cheap",) if fl is None else ()):
                own = None if fl is None else {d: fl[d] for d in rowset}
                res = crossfit(rowset, budgets, k=k, seed=seed, exclude=skip, floors=own, margin=margin,
                               ranker_factors={d: factors[d] for d in rowset}, prefer=prefer)
                distinct = len({json.dumps(f["config"], sort_keys=True) for f in res["folds"]})
                for d in rowset:
                    ins = {b: sum(f["in_sample"][d][b] for f in res["folds"]) / k for b in budgets}
                    out = {b: sum(f["held_out"][d][b] for f in res["folds"]) / k for b in budgets}
                    data.append({"scope": scope, "dataset": d, "rule": name, "prefer": prefer, "in_sample": ins,
                                 "held_out_fold_mean": out, "crossfit": res["datasets"][d]["recall"],
                                 "distinct_configs": distinct})
                    rows.append([scope, d, name, PREFER_NAMES[prefer],
                                 *(f"{100 * res['datasets'][d]['recall'][b]:.1f}" for b in budgets),
                                 *(f"{100 * ins[b]:.1f}" for b in budgets),
                                 *(f"{100 * (ins[b] - out[b]):+.1f}" for b in budgets), str(distinct)])
    head = ["configs", "dataset", "rule", "final choice", *(f"held-out R@{b}" for b in budgets),
            *(f"in-sample R@{b}" for b in budgets), *(f"gap @{b}" for b in budgets), "distinct fold configs"]
    return md_table(head, rows, "llll" + "r" * (3 * len(budgets) + 1)), data


def margins_md(report: dict, k: int, seed: int) -> str:
    """Each shipped file's lead over the strongest Direct-R after its cross-fitted gap (``effrag.tuning.margin``)."""
    rows = []
    for scope, ds, m in ([(f"loop-{ds}.json" + (" (= loop.json)" if r.get("ships") == "loop.json" else ""), ds,
                           r.get("margins")) for ds, r in report["per_dataset"].items()]
                         + [("loop.json", ds, m) for ds, m in report["general"].get("margins", {}).items()]):
        for b, x in sorted((m or {}).items()):
            rows.append([scope, ds, f"<= {b} vs @{x['target']} ({x['bar']})", f"{100 * x['bar_recall']:.1f}",
                         f"{100 * x['lead_in_sample']:+.1f}", f"{100 * x['gap']:+.1f}", f"{100 * x['se']:.1f}",
                         f"{100 * x['margin_needed']:.1f}", f"{100 * (x['lead_in_sample'] - max(x['gap'], 0)):+.1f}",
                         f"{100 * x['lead_held_out']:+.1f}", "yes" if x["keeps"] else "**no**"])
    head = ["file", "dataset", "budget vs bar", "bar %", "lead in-sample", "gap", "SE", "margin needed (gap + SE)",
            "lead after gap", "lead held out", "survives"]
    return ("A lead that survives unseen questions (issue #67): the shipped pick's lead over the strongest Direct-R "
            "on the questions that chose it, less the cross-fitted gap of its rule (the mean over "
            f"{k} folds, seed {seed}, of the fold pick's in-sample minus held-out recall; a negative gap counts as "
            "0), must be at least one standard error of the per-question difference. Points of recall.\n\n"
            + md_table(head, rows, "lll" + "r" * 7 + "l") + "\n")


def ranker_factor_for(setup: dict, system: Path | None, name: str, parser) -> float:
    """A tuning folder's ranker read factor: from the system's folder ``name`` when ``--system`` holds it (the
    tuning's own path may since hold another model), checked against the fingerprint the tuning recorded; else from
    the folders the tuning read."""
    from effrag.models.model_files import fingerprint
    from effrag.tuning.loop_configs import setup_ranker_factor
    from effrag.tuning.loop_cost import ranker_read_factor

    if system is None or not (system / name).is_dir():
        return setup_ranker_factor(setup)
    tuned = (setup.get("model_files") or {}).get("ranker")
    if tuned and fingerprint(system / name) != tuned:
        parser.error(f"{system / name} is not the ranker the tuning read (fingerprint {fingerprint(system / name)} "
                     f"against {tuned}): tune it again, or tag the rows with the folder that holds it")
    return ranker_read_factor(system / name, system / "labeler")


def main(argv=None) -> int:
    from effrag.cli_args import (
        add_budgets_arg,
        add_data_dir_arg,
        add_evidence_arg,
        add_keep_sample_arg,
        add_output_arg,
        add_seed_arg,
        add_source_args,
        add_system_arg,
    )
    from effrag.provenance import report_source

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # --tune, --evidence or both (a report's evidence with another ranker's tuning rows added)
    p.add_argument("--tune", nargs="+", metavar="DATASET=DIR[@RANKER]",
                     help="tuning folders (scripts/tune_efficientrag.py); DIR@RANKER tags its rows with the system's "
                          "ranker folder they were tuned with (e.g. @ranker-teacher), and a dataset may be given "
                          "several folders, one per ranker: the rule then chooses among all their configs, each "
                          "read costed by its own ranker")
    add_evidence_arg(p, help="a report's evidence/ folder (<dataset>.json.gz): every table rebuilt from it alone, no "
                             "data folder or tuning run needed; with --tune, their rows are added to its own (the "
                             "Direct-R baselines stay the evidence's) and the merged evidence is written")
    add_data_dir_arg(p)
    add_system_arg(p, help="write loop-<dataset>.json and loop.json into this system folder")
    add_output_arg(p, required=True)
    add_budgets_arg(p)
    p.add_argument("--targets", nargs="+", default=[f"{b}={d}" for b, d in TARGETS.items()], metavar="CHUNKS=DEPTH",
                   help="the bar of each budget: EfficientRAG with at most CHUNKS against the strongest Direct-R@DEPTH "
                        "(default 7=20 10=30)")
    p.add_argument("--encoders", nargs="+", default=[DEFAULT_ENCODER], metavar="ALIAS|PATH",
                   help="the baseline's dense and hybrid run with each (e.g. minilm e5-small): the bar is the strongest "
                        "of them all; the loop's own retriever is the tuning folders'")
    p.add_argument("--folds", type=int, default=5)
    add_seed_arg(p, help="the folds' seed")
    p.add_argument("--rule", choices=("best", "cheapest"), default="best",
                   help="best: the best recall at the budgets; cheapest: the config that reads least while keeping the "
                        "bar (the strongest Direct-R at the budgets' targets on the same questions, + --margin)")
    p.add_argument("--margin", default="se", help="--rule cheapest: points above the bar, or se (default): one "
                   "standard error of the per-question difference to the strongest Direct-R on the choosing questions")
    p.add_argument("--prefer", choices=tuple(PREFER_NAMES), default="recall",
                   help="the rule's final choice: best recall; simple: the simplest config (fewest and smallest "
                        "pool bonuses) within one standard error of the best (issue #48's noise-resistant rule); "
                        "cheap: the cheapest cost point within one standard error of the best recall, then its "
                        "simplest (issue #67: recall first, cost breaks ties; the shipped rule)")
    p.add_argument("--fall-back", action="store_true",
                   help="where a dataset's own rule does not beat loop.json's cross-fitted recall on its questions, "
                        "loop-<dataset>.json ships loop.json's config (issue #67)")
    p.add_argument("--over", metavar="TEXT", help="what the rows were tuned over, written into each loop config's "
                   "chosen_on (e.g. which report chose the structures)")
    add_keep_sample_arg(p)
    add_source_args(p)
    args = p.parse_args(argv)
    if not args.tune and not args.evidence:
        p.error("give --tune, --evidence or both")
    try:
        targets = {int(b): int(d) for b, _, d in (t.partition("=") for t in args.targets)}
    except ValueError:
        p.error(f"--targets {' '.join(args.targets)}: expected CHUNKS=DEPTH pairs, e.g. 7=20 10=30")
    commit = report_source(args.output, args.allow_dirty)
    from effrag.tuning.evidence import read_evidence, write_evidence
    from effrag.tuning.loop_configs import read_rows, write_loop_configs

    tunes, evidence = {}, {}
    if args.evidence:
        files = sorted(args.evidence.glob("*.json.gz"))
        if not files:
            p.error(f"--evidence {args.evidence}: no <dataset>.json.gz files there")
        for f in files:
            evidence[f.name.removesuffix(".json.gz")] = read_evidence(f)
        tunes = {ds: e["rows"] for ds, e in evidence.items()}
    tagged: dict[str, dict[str, float]] = {}
    for item in args.tune or []:
        ds, sep, folder = item.partition("=")
        if not sep:
            p.error(f"--tune {item!r}: expected DATASET=DIR")
        folder, at, ranker = folder.partition("@")
        rows = read_rows(Path(folder))
        factor = ranker_factor_for(rows[0]["setup"], args.system, ranker or "ranker", p)
        if at:
            if not ranker.startswith("ranker") or "/" in ranker:
                p.error(f"--tune {item!r}: @{ranker} is not a ranker folder name (ranker or ranker-<name>)")
            rows = [{**r, "config": {**r["config"], "ranker": ranker}, "setup": {**r["setup"], "ranker": ranker}}
                    for r in rows]
        tagged.setdefault(ds, {})[ranker or "ranker"] = factor
        if ds in evidence and any(r["config"].get("ranker", "ranker") == (ranker or "ranker")
                                  for r in evidence[ds]["rows"]):
            p.error(f"--tune {item!r}: the evidence already holds {ds}'s rows read with {ranker or 'ranker'}")
        tunes[ds] = tunes.get(ds, []) + rows
    from effrag.data import sample_question_ids

    skip = [] if args.keep_sample else sample_question_ids(tunes)
    args.output.mkdir(parents=True, exist_ok=True)
    system = args.system or args.output / "configs"
    system.mkdir(parents=True, exist_ok=True)
    try:
        margin = "se" if args.margin == "se" else float(args.margin) / 100
    except ValueError:
        p.error(f"--margin {args.margin!r}: expected a number of points or se")
    if evidence:
        if set(tunes) - set(evidence):
            p.error(f"--tune: {', '.join(sorted(set(tunes) - set(evidence)))} has no file in --evidence {args.evidence}")
        both = {ds: (e["direct_r"], e["direct_r_per_question"]) for ds, e in evidence.items()}
        factors = {ds: e["ranker_factor"] for ds, e in evidence.items()}
        for ds, by_ranker in tagged.items():  # rows added to the evidence's: costed by their own ranker
            old = factors[ds] if isinstance(factors[ds], dict) else {"ranker": factors[ds]}
            factors[ds] = {**old, **by_ranker}
        for ds in evidence if tagged else ():  # rows were added: the evidence of what this report chose from
            write_evidence(args.output / "evidence" / f"{ds}.json.gz", ds, tunes[ds], *both[ds],
                           ranker_factor=factors[ds])
    else:
        both = {ds: direct_r(args.data, ds, set(skip), args.encoders, tuple(sorted(set(targets.values()))))
                for ds in tunes}
        factors = {ds: by_ranker if len(by_ranker) > 1 else next(iter(by_ranker.values()))
                   for ds, by_ranker in tagged.items()}
        for ds, rows in tunes.items():
            write_evidence(args.output / "evidence" / f"{ds}.json.gz", ds, rows, *both[ds], ranker_factor=factors[ds])
    direct = {ds: d for ds, (d, _) in both.items()}
    for ds, (_, per_q) in both.items():
        held = {int(k) for by_k in per_q.values() for k in by_k}
        if args.rule == "cheapest" and not set(targets.values()) <= held:
            p.error(f"--targets: {ds}'s per-question Direct-R recall is at depths {sorted(held)} only")
    bars = floors_of({ds: q for ds, (_, q) in both.items()}, args.budgets, targets)
    floors = bars if args.rule == "cheapest" else None
    report = write_loop_configs(tunes, system, budgets=args.budgets, k=args.folds, seed=args.seed, exclude=skip,
                                floors=floors, margin=margin, ranker_factors=factors, prefer=args.prefer,
                                fall_back=args.fall_back, bars=bars, targets=targets, over=args.over)
    report["commit"] = commit
    report["direct_r"] = {ds: {kd: {str(k): v for k, v in c.items()} for kd, c in d.items()} for ds, d in direct.items()}
    t2 = table2(report, direct, args.budgets, targets)
    cv, plot = curve(report, direct)
    who = ("every dev question except the bundled sample's (the quickstart's)" if skip else "every dev question")
    how = (f"best mean recall at {' and '.join(map(str, args.budgets))} chunks" if args.rule == "best" else
           f"the config that reads least among those whose recall at {' and '.join(map(str, args.budgets))} chunks "
           f"keeps the strongest Direct-R@{' and @'.join(str(targets[b]) for b in args.budgets if b in targets)} of "
           "the same questions + " + ("one standard error of the per-question difference" if margin == "se" else
                                      f"{args.margin} points") + ", else the best recall")
    if args.prefer == "cheap":
        how += ("; of the configs within one standard error of the best recall, the cheapest cost point, then its "
                "simplest pool weights")
    if args.fall_back:
        how += ("; loop-<dataset>.json ships loop.json's config where the dataset's own rule does not beat it "
                "cross-fitted")
    if args.prefer == "simple":
        how += ("; the final choice: the simplest config (fewest and smallest pool bonuses) within one standard "
                "error of the best recall" + ("" if args.rule == "best" else " among the cheapest one's structure"))
    note = (f"Recall %. EfficientRAG figures are cross-fitted ({args.folds} folds, seed {args.seed}): each question "
            f"is scored by the config chosen on the other folds ({how}; loop.json: jointly over the datasets). "
            f"Questions: {who}. Retriever under the loop: {report['retriever']}"
            + (f", its dense leg {report['encoder']}" if report.get("encoder") else "") + ".\n")
    (args.output / "table2.md").write_text(note + "\n" + t2)
    (args.output / "curve.md").write_text("Recall % at k chunks (cross-fitted), against the strongest Direct-R@k "
                                          "(its retriever in brackets)\n\n" + cv)
    pt, report["pareto"] = pareto_table(tunes, direct, args.folds, args.seed, skip, factors)
    (args.output / "pareto.md").write_text(
        "Each cost point the tuning tried: what the loop read per question (held-out questions' mean) and recall % "
        f"cross-fitted within the point ({args.folds} folds, seed {args.seed}: its other options, e.g. the pool "
        "weights, chosen on the other folds by best recall at 7 and 10). *ranker*: the system's folder the loop "
        "read with (ranker: its own; ranker-teacher: the larger one it was distilled from). *pair reads/q* weighs "
        "each read by its input length (a Filter input is 0.25 of a pair) and a ranker read by the ranker's layers "
        "and own input length against the Labeler's; seconds are scripts/bench_loop_cost.py's.\n\n" + pt + "\n")
    # every rule side by side, the bar's (the shipped rule before issue #67) included whatever --rule chose
    st, report["selection"] = selection_table(tunes, bars, margin, factors, args.budgets, args.folds, args.seed, skip)
    (args.output / "selection.md").write_text(
        "How much each selection rule fits the questions that chose: per fold, the chosen config's recall % on its "
        "choosing questions (in-sample) against the held-out fold's; *gap* is their difference averaged over the "
        f"{args.folds} folds (seed {args.seed}), *held-out* the pooled cross-fitted recall. *simplest within 1 SE*: of "
        "the configs the rule would choose among (for the cheapest rule: the cheapest config's options but the "
        "pool weights), the one with the fewest and smallest pool bonuses whose recall is within one standard "
        "error of the best one's. *cheapest within 1 SE*: each cost point's recall cross-fitted within the choosing "
        "questions, the cheapest point within one standard error of the best point, its best-recall pool weights "
        "(nested: the outer folds never choose). Questions: every dev question but the bundled sample's.\n\n"
        + st + "\n")
    (args.output / "margins.md").write_text(margins_md(report, args.folds, args.seed))
    (args.output / "crossfit.json").write_text(json.dumps(report, indent=1, default=str))
    try:
        from effrag.evaluation.plots import write_report_plot

        write_report_plot(plot, args.output, title="EfficientRAG (cross-fitted) vs the strongest Direct-R, dev files")
    except ImportError as e:  # matplotlib is the optional [plots] extra
        print(f"plot skipped: {e}", file=sys.stderr)
    print(note + "\n" + t2 + "\n\n" + cv)
    if args.system:
        write_card(args.system, args.output, report)
    return 0


def write_card(system: Path, output: Path, report: dict) -> None:
    """The system folder's README.md: its own head kept, the dev figures (``output``'s table2.md and curve.md, between
    the dev-figures markers that scripts/render_headline.py checks) and the shipped configs rewritten."""
    from effrag.pretrained.card import dev_figures_markdown, markers

    card = system / "README.md"
    if (system / "export.json").is_file():  # a shipped system retuned in place: its head's table follows the new configs
        from effrag.training.export import shipped_card

        export = json.loads((system / "export.json").read_text())
        card.write_text(shipped_card(system, export.get("int8_bytes", {}), source=export.get("source")))
    head = card.read_text().split("\n## Dev figures")[0].rstrip() + "\n" if card.is_file() else (
        f"# {system.name}\n\nAn EfficientRAG system: Labeler (`labeler/`), Filter (`filter/`), pool ranker "
        "(`ranker/`), the general loop config (`loop.json`) and one per dev file (`loop-<dataset>.json`). Open it "
        f"with `EfficientRAG.from_pretrained(\"{system}\", corpus=...)` or `effrag eval --method efficientrag "
        f"--model {system} ...`.\n")
    shipped = ["- `loop.json` (chosen jointly): " + json.dumps(_short(report["general"]["chosen"]["config"]))]
    shipped += [f"- `loop-{d}.json`: " + json.dumps(_short(r["chosen"]["config"]))
                for d, r in report["per_dataset"].items()]
    start, end = markers("dev-figures")
    dev = dev_figures_markdown((output / "table2.md").read_text(), (output / "curve.md").read_text())
    card.write_text(head + "\n## Dev figures (cross-fitted)\n\n" + start + "\n" + dev + end + "\n\n## Loop configs\n\n"
                    + "\n".join(shipped) + "\n")


def _short(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("batch_size", "bf16", "chunk_format")}


if __name__ == "__main__":
    sys.exit(main())
