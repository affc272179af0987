"""IRRR chosen and scored as EfficientRAG is: options chosen on some dev folds, recall on the held-out fold.

Each (query threshold, first-step depth) runs once per dev question with no early stop (``effrag.tuning.irrr``:
resumable, one row per question in ``--runs``); every answerability threshold and fill order is replayed from those
steps, and the returned paragraphs (the path, then the other candidates read, up to ``--return-k``) are cut at 1..10
like EfficientRAG's pool (:func:`effrag.tuning.irrr.crossfit_rows`). The choice is the config with the best mean
recall at 7 and 10 paragraphs, on every dev question of the three datasets jointly (one ``irrr.json`` for every
corpus, as ``loop.json``), the bundled sample's questions left out of every choice and every figure
(``--keep-sample`` keeps them). :func:`effrag.tuning.crossfit.crossfit` gives the held-out figures: 5 folds, each
scored by the config chosen on the other four, per dataset and jointly.

Writes ``OUTPUT/table.md`` (IRRR beside Direct-R and EfficientRAG on the same questions: the strongest
Direct-R and EfficientRAG's cross-fitted curve come from ``--er-report``, EfficientRAG's ``crossfit.json``),
``OUTPUT/crossfit.json``, ``OUTPUT/evidence/<dataset>.json.gz`` (every config's per-question positions: the table
rebuilds from them with ``--evidence``, no model or data) and, with ``--system DIR``, ``DIR/irrr.json``: the joint
choice, which ``effrag eval --method irrr`` uses for that model folder.

    python scripts/irrr_report.py --irrr checkpoints/irrr-all --data ../shared/data --runs runs/irrr-crossfit \\
        --system checkpoints/irrr-all --output reports/irrr/crossfit
    python scripts/irrr_report.py --evidence reports/irrr/crossfit/evidence --output runs/irrr-table
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SHOWN = (5, 7, 10)
FORMAT = 1


def parse_args(argv=None) -> argparse.Namespace:
    from effrag.cli_args import (
        add_budgets_arg,
        add_data_args,
        add_evidence_arg,
        add_irrr_arg,
        add_keep_sample_arg,
        add_output_arg,
        add_seed_arg,
        add_source_args,
        add_system_arg,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    add_irrr_arg(src, help="IRRR model folder or shipped name: run the grid")
    add_evidence_arg(src, help="rebuild the tables from these evidence files alone")
    add_data_args(ap)
    ap.add_argument("--runs", type=Path, default=Path("runs/irrr-crossfit"), help="per-question steps (resumable)")
    ap.add_argument("--query-thresholds", type=float, nargs="+", default=[0.15, 0.3])
    ap.add_argument("--first-k", type=int, nargs="+", default=[10])
    ap.add_argument("--answer-thresholds", type=float, nargs="+", default=[-4, -2, 0, 2, 4, 99],
                    help="99: never stop early (the path grows to --max-path)")
    ap.add_argument("--fill-orders", nargs="+", default=["retrieval", "rerank"])
    ap.add_argument("--k", type=int, default=5, help="candidates per later step (the paper's 5)")
    ap.add_argument("--max-path", type=int, default=4)
    ap.add_argument("--return-k", type=int, default=10)
    add_budgets_arg(ap)
    ap.add_argument("--folds", type=int, default=5)
    add_seed_arg(ap, help="the folds' seed")
    add_keep_sample_arg(ap)
    ap.add_argument("--er-report", type=Path, default=Path("reports/efficientrag/crossfit/crossfit.json"),
                    help="EfficientRAG's cross-fitted report (its Direct-R curves and held-out curves)")
    add_system_arg(ap, help="write the joint choice to DIR/irrr.json")
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


def run_grid(args) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """The grid's rows per dataset and each dataset's setup (corpus fingerprint, questions, model)."""
    from effrag.models import IRRRModel
    from effrag.pretrained import resolve_model
    from effrag.provenance import portable_path
    from effrag.setup import dataset_file, open_corpus
    from effrag.tuning.efficientrag import model_fingerprint
    from effrag.tuning.irrr import crossfit_rows, runs_to_cap

    path = resolve_model(args.irrr)
    model = IRRRModel.from_pretrained(path)
    args.runs.mkdir(parents=True, exist_ok=True)
    runs = runs_to_cap(model, args.data, args.datasets, args.runs, limit=args.limit, query_thresholds=args.query_thresholds,
                       first_ks=args.first_k, k=args.k, max_path=args.max_path)
    rows = crossfit_rows(runs, args.answer_thresholds, args.fill_orders, args.return_k, k=args.k,
                         max_path=args.max_path)
    setups = {}
    for ds, by_q in next(iter(runs.values())).items():  # what the runs searched: EfficientRAG's corpus (checked below)
        dev = dataset_file(args.data, ds, "dev")
        corpus = open_corpus(corpus_from=[dataset_file(args.data, ds, "train"), dev], questions_path=dev)
        setups[ds] = {"dataset": ds, "questions": f"{ds}/dev.jsonl", "retriever": "bm25",
                      "corpus_fingerprint": corpus.fingerprint(), "corpus_size": len(corpus),
                      "n": len(by_q), "model": portable_path(path), "model_files": model_fingerprint(path)}
    return rows, setups


def write_evidence(out: Path, rows: dict[str, list[dict]], setups: dict[str, dict]) -> None:
    from effrag.tuning.evidence import write_gz_json

    for ds, rs in rows.items():
        write_gz_json(out / f"{ds}.json.gz", {"format": FORMAT, "dataset": ds, "setup": setups[ds], "rows": rs})


def read_evidence(folder: Path, datasets) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    from effrag.tuning.evidence import read_gz_json

    rows, setups = {}, {}
    for ds in datasets:
        try:
            data = read_gz_json(folder / f"{ds}.json.gz", "an IRRR evidence file", FORMAT)
        except ValueError as e:
            raise SystemExit(f"irrr_report: {e}")
        rows[ds], setups[ds] = data["rows"], data["setup"]
    return rows, setups


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def table(report: dict, er: dict | None, setups: dict[str, dict]) -> str:
    from effrag.evaluation.report import md_table

    head = ["dataset (questions)", *(f"BM25 Direct-R @{k}" for k in SHOWN), *(f"strongest Direct-R @{k}" for k in SHOWN),
            *(f"EfficientRAG <= {k}" for k in SHOWN),
            *(f"IRRR <= {k}, irrr.json" for k in SHOWN), *(f"IRRR <= {k}, per dataset" for k in SHOWN),
            "IRRR paragraphs read per question", "corpus = EfficientRAG's"]
    body = []
    for ds, own in report["per_dataset"].items():
        joint = report["joint"]["datasets"][ds]
        at = lambda res, k: next(r for c, r, _ in res["curve"] if c == k)  # noqa: E731
        cells = [f"{ds} ({own['n']})"]
        if er and ds in er.get("direct_r", {}):
            dr = er["direct_r"][ds]
            cells += [pct(dr["bm25"][str(k)]) for k in SHOWN]  # IRRR's own retriever, alone
            for k in SHOWN:
                kind = max(dr, key=lambda kd: dr[kd][str(k)])
                cells.append(f"{pct(dr[kind][str(k)])} {kind}")
            mine = er["per_dataset"][ds]["crossfit"]["datasets"][ds]
            cells += [pct(at(mine, k)) for k in SHOWN]
        else:
            cells += ["-"] * (3 * len(SHOWN))
        cells += [f"**{pct(at(joint, k))}**" for k in SHOWN]
        cells += [pct(at(own, k)) for k in SHOWN]
        cells.append(f"{joint['forwards'][0]:.1f}")
        fp = (er or {}).get("corpus_fingerprints", {}).get(ds)
        cells.append("-" if fp is None else ("yes" if fp == setups[ds]["corpus_fingerprint"] else "no"))
        body.append(cells)
    return md_table(head, body, "l" + "r" * (len(head) - 1))


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source
    from effrag.tuning.crossfit import CAPS, choose, crossfit

    commit = report_source(args.output, args.allow_dirty)
    if args.evidence:
        rows, setups = read_evidence(args.evidence, args.datasets)
    else:
        rows, setups = run_grid(args)
        write_evidence(args.output / "evidence", rows, setups)
    from effrag.data import sample_question_ids

    skip = [] if args.keep_sample else sample_question_ids(args.datasets)
    for ds in args.datasets:
        left = {pq[0] for pq in rows[ds][0]["per_question"]} - set(skip)
        if len(left) < args.folds:
            raise SystemExit(f"irrr_report: {ds}: {len(left)} question(s) outside the bundled sample, fewer than the "
                             f"{args.folds} folds (--keep-sample lets the sample's questions count)")
    common = dict(budgets=args.budgets, caps=CAPS, exclude=skip)
    per_dataset = {}
    for ds in args.datasets:
        res = crossfit({ds: rows[ds]}, k=args.folds, seed=args.seed, **common)
        per_dataset[ds] = {**res["datasets"][ds], "folds": res["folds"]}
    joint = crossfit(rows, k=args.folds, seed=args.seed, **common)
    pick = choose(rows, **common)
    config = {k: v for k, v in pick["config"].items() if k != "max_candidates"}
    who = "every dev question except the bundled sample's (the quickstart's)" if skip else "every dev question"
    report = {"budgets": args.budgets, "folds": args.folds, "seed": args.seed, "excluded": len(skip), "questions": who,
              "rule": "best mean recall at the budgets over the datasets", "per_dataset": per_dataset, "joint": joint,
              "chosen": pick, "setups": setups, "commit": commit}
    er = None
    if args.er_report.is_file():
        er = json.loads(args.er_report.read_text())
        er.setdefault("corpus_fingerprints", {})
        for ds in args.datasets:  # the corpus EfficientRAG's figures were measured on (its tuning setups)
            ev = args.er_report.parent / "evidence" / f"{ds}.json.gz"
            if ev.is_file():
                from effrag.tuning.evidence import read_evidence as read_er

                er["corpus_fingerprints"][ds] = read_er(ev)["rows"][0]["setup"].get("corpus_fingerprint")
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "crossfit.json").write_text(json.dumps(report, indent=1) + "\n")
    caption = (f"Recall % of gold paragraphs with at most k returned, cross-fitted ({args.folds} folds, seed "
               f"{args.seed}): each question scored by the options chosen on the other folds (best mean recall at "
               f"{' and '.join(map(str, args.budgets))}; irrr.json: jointly over the datasets, what ships). Questions: "
               f"{who}. IRRR over BM25, the strongest Direct-R (best of BM25, dense, hybrid at that depth) and "
               f"EfficientRAG's held-out curve (its loop-<dataset>.json protocol, over hybrid) from `{args.er_report}`.")
    (args.output / "table.md").write_text(caption + "\n\n" + table(report, er, setups))
    if args.system:
        info = {"config": config, "retriever": "bm25", "chosen_on": {"questions": who,
                                                                      "n": pick["chosen_on"],
                                                                      "rule": report["rule"] + f" ({args.budgets})"},
                "crossfit": {ds: {"recall": {str(b): round(r, 4) for b, r in joint["datasets"][ds]["recall"].items()},
                                  "n": joint["datasets"][ds]["n"], "folds": args.folds, "seed": args.seed}
                             for ds in args.datasets},
                "in_sample_recall": {ds: {str(b): round(v, 4) for b, v in r.items()}
                                     for ds, r in pick["in_sample"].items()}}
        (args.system / "irrr.json").write_text(json.dumps(info, indent=2) + "\n")
    print((args.output / "table.md").read_text())
    print(f"chosen (irrr.json): {json.dumps(config)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
