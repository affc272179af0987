#!/usr/bin/env python
"""The cost Pareto table of issue #45: each cost point measured in seconds beside its cross-fitted recall.

Joins ``scripts/bench_loop_cost.py`` runs (their ``report.json``: each variant's reads per question by model, seconds
per question and pair-forward equivalents, *pfe*) with ``scripts/efficientrag_report.py``'s cross-fitted recall of the
same cost point (``crossfit.json``'s ``pareto``: recall at 5 / 7 / 10 chunks within the point, its other options
chosen on the other folds) and the strongest Direct-R's recall at 20 and 30 on the same questions. A variant is
matched by the options that decide what the loop reads (:data:`effrag.tuning.loop_cost.COST_OPTIONS`) and the ranker
folder its dataset's shipped config reads with; one the tuning never tried is listed without recall.

    python scripts/loop_cost_pareto.py --bench reports/efficientrag/loop-cost/cpu-v3-pareto-* \\
      --crossfit reports/efficientrag/crossfit/crossfit.json --output reports/efficientrag/loop-cost/pareto.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

POINT_OPTIONS = ("first_hop_k", "hop_k", "labeler_top", "max_hops", "rescore_top", "ranker_max_length",
                 "labeler_max_length")


def point_of(config: dict, ranker: str, ranker_length: int | None) -> dict:
    """A config's cost point as the tuning's cost curve names it; a ranker cut at its own trained length is no cut."""
    out = {k: config[k] for k in POINT_OPTIONS if config.get(k) is not None}
    if out.get("ranker_max_length") is not None and out["ranker_max_length"] == ranker_length:
        del out["ranker_max_length"]
    return {**out, "ranker": ranker}


def shipped_ranker(model: str, dataset: str) -> tuple[str, int | None]:
    """The ranker folder name a system's ``loop-<dataset>.json`` reads with, and its trained input length."""
    from effrag.pipelines.efficientrag.system import open_system

    system = open_system(model, dataset=dataset)
    if system.ranker is None:
        return "ranker", None
    meta = json.loads((Path(system.ranker) / "effrag_config.json").read_text())
    return Path(system.ranker).name, meta.get("max_length")


def shipped_point(model: str, dataset: str) -> tuple[dict, bool]:
    """The cost point the system's ``loop-<dataset>.json`` ships today, and whether it labels the last hop: a bench
    row is marked *ships* when it read exactly that (an older bench's ``shipped`` row may not)."""
    from effrag.pipelines.efficientrag import build_config
    from effrag.pipelines.efficientrag.system import open_system

    config = build_config(open_system(model, dataset=dataset).config).to_json()
    return point_of(config, *shipped_ranker(model, dataset)), config.get("label_last_hop", True)


def rows_of(bench: Path, curve: list[dict], bars: dict, model: str) -> list[list[str]]:
    report = json.loads((bench / "report.json").read_text(encoding="utf-8"))
    setup = report["setup"]
    dataset = setup["dataset"]
    # the ranker the bench read with (its report says since 2026-11-28); an older report: the system's, today
    ranker, length = ((setup["ranker"], setup.get("ranker_length")) if setup.get("ranker")
                      else shipped_ranker(model, dataset))
    prepared = "prepared" if (setup.get("prepared") or {}).get("passages") else "unprepared"
    ships = shipped_point(model, dataset)
    out = []
    for r in report["rows"]:
        config = {**setup["base_config"], **r["changes"]}
        point, last = point_of(config, ranker, length), config.get("label_last_hop", True)
        match = next((c for c in curve if {"ranker": "ranker", **c["point"]} == point), None)  # own ranker: unnamed
        rec = (["-"] * 3 if match is None else [f"{100 * match['recall'][str(b)]:.1f}" for b in (5, 7, 10)])
        keeps = ["-"] * 2 if match is None else \
            ["yes" if match["recall"][str(b)] >= bars[t] else "no" for b, t in ((7, 20), (10, 30))]
        # the last hop read by the Labeler or not: the same pools (config.label_last_hop), so the same recall
        labels = "" if last else ", no last-hop labels"
        # a bench's base row is "shipped" for the system it ran; it ships only if it read what ships today
        name = r["name"] if r["name"] != "shipped" or (point, last) == ships else "its system's config"
        out.append([dataset, name + (" **(ships)**" if (point, last) == ships else ""), ranker,
                    ", ".join(f"{k} {v}" for k, v in point.items() if k != "ranker") + labels, prepared,
                    " / ".join(f"{x:.1f}" for x in r["read_per_q"]), f"{r['s_per_q']:.3f}",
                    f"{1000 * r['unit_s']:.1f}", f"{r['ratio']:.1f}", *rec, *keeps,
                    f"{bench.name} ({report.get('commit', '?')})"])
    return out


def main(argv=None) -> int:
    from effrag.cli_args import add_output_arg, add_source_args
    from effrag.provenance import report_source

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", nargs="+", type=Path, required=True, help="bench_loop_cost.py output folders")
    p.add_argument("--crossfit", type=Path, nargs="+", default=[Path("reports/efficientrag/crossfit/crossfit.json")],
                   help="crossfit.json files: a point's recall comes from the first that tried it (a ranker's own "
                        "report holds the rows the shipping report does not)")
    p.add_argument("--model", default="efficientrag-all")
    add_output_arg(p, required=True, help="the markdown table (its uncommitted diff, if any, goes beside it)",
                   metavar="FILE")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.output.parent, args.allow_dirty, name=f"{args.output.stem}.uncommitted.diff")
    fits = [json.loads(f.read_text(encoding="utf-8")) for f in args.crossfit]
    cf = fits[0]  # the bars (Direct-R on the same questions) are the first report's
    rows = []
    for bench in args.bench:
        if not (bench / "report.json").is_file():
            raise SystemExit(f"{bench}: no report.json (a scripts/bench_loop_cost.py output folder?)")
        dataset = json.loads((bench / "report.json").read_text())["setup"]["dataset"]
        direct = cf["direct_r"][dataset]
        bars = {t: max(direct[kind][str(t)] for kind in direct) for t in (20, 30)}
        rows += rows_of(bench, [c for f in fits for c in f["pareto"].get(dataset, [])], bars, args.model)
    from effrag.evaluation.report import md_table

    head = ["dataset", "variant", "ranker", "cost point", "corpus", "read/q (Labeler / ranker / Filter)", "s/q",
            "unit ms/pair", "pfe", "R@5", "R@7", "R@10", "@7 >= strongest @20", "@10 >= strongest @30", "bench"]
    text = (f"Cross-fitted recall from {', '.join(f'`{f.as_posix()}`' for f in args.crossfit)} (the first that tried "
            "a point; 5 folds; the choosing questions never score "
            "their own pick); seconds, reads and *pfe* (the loop's seconds per question over one plain MiniLM-L6 pair "
            "forward in the same run; target <= 12) from each bench folder, named in the last column with its "
            "commit. `-`: a cost point the tuning did not try. Command: `python scripts/loop_cost_pareto.py "
            + " ".join(sys.argv[1:] if argv is None else argv) + f"`, at commit {commit}.\n\n"
            + md_table(head, rows, "lllllrrrrrrrlll"))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
