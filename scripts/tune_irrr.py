"""Tune IRRR's query-word and answerability thresholds on dev questions (the paper tunes them on dev for QA).

The answerability threshold only decides *when* the loop stops, and the path it grows does
not depend on it, so each (query threshold, first-step depth) is run once with no stopping
(to ``max_path``) and every answerability threshold is replayed from the per-step traces:
the first step whose best answerability reaches it gives the answer and the returned
paragraphs (filled up to ``--return-k`` when given, in each ``--fill-order`` replayed). The objective is
mean F1 (``--objective f1``) or mean recall of gold paragraphs (``recall``) over datasets;
ties: fewer paragraphs read. Writes ``OUT/grid.json``, ``OUT/table.md`` and ``OUT/best.json``
(an ``--irrr-config`` for ``bench_irrr.py``).

    python scripts/tune_irrr.py --irrr checkpoints/irrr-all --data ../shared/data --limit 40 --output runs/tune_irrr
    python scripts/tune_irrr.py --irrr checkpoints/irrr-all --limit 100 --first-k 5 10 --return-k 10 \
        --objective recall --output runs/tune_irrr_recall
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def replay(steps: list[dict], threshold: float, return_k: int | None = None,
           fill_order: str = "rerank") -> tuple[str, list[str], int, int]:
    """(answer, returned ids, steps taken, paragraphs read) had the loop stopped at ``threshold``."""
    from effrag.pipelines.irrr import outcome

    read = 0
    for i, s in enumerate(steps):
        read += len(s["candidates"])
        if s.get("best") and s["best"]["answerability"] >= threshold:
            stop = {**{k: v for k, v in s.items() if k != "appended"}, "stop": "answerable"}  # as the loop would
            o = outcome(steps[:i] + [stop], return_k, fill_order)
            return o["answer"], o["retrieved"], i + 1, read
    o = outcome([{k: v for k, v in s.items() if k != "stop"} for s in steps], return_k, fill_order)
    return o["answer"], o["retrieved"], len(steps), read


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--irrr", required=True)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--datasets", nargs="+", default=["hotpotqa", "2wikimqa", "musique"])
    ap.add_argument("--limit", type=int, default=40, help="first N dev questions per dataset")
    ap.add_argument("--query-thresholds", type=float, nargs="+", default=[0.2, 0.35, 0.5])
    ap.add_argument("--answer-thresholds", type=float, nargs="+", default=[-4, -2, -1, 0, 1, 2, 3, 4, 6])
    ap.add_argument("--max-path", type=int, default=4)
    ap.add_argument("--k", type=int, default=5, help="candidates per step")
    ap.add_argument("--first-k", type=int, nargs="+", default=[None],
                    help="candidates at the first step (grid; default: --k)")
    ap.add_argument("--return-k", type=int, default=None,
                    help="fill the returned paragraphs up to this many (default: path only)")
    ap.add_argument("--fill-order", nargs="+", choices=["rerank", "retrieval"], default=["rerank"],
                    help="orders of the --return-k fill to replay (grid; no rerun)")
    ap.add_argument("--objective", choices=["f1", "recall"], default="f1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", required=True, type=Path)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from effrag.data import load_questions
    from effrag.evaluation.metrics import f1, recall
    from effrag.setup import RunSetup, dataset_file
    from effrag.jsonl import ResultLog
    from effrag.models import IRRRModel
    from effrag.pipelines.irrr import IRRRConfig, IRRRRunner

    model = IRRRModel.from_pretrained(args.irrr).eval()
    args.output.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple, dict[str, list]] = {}
    setups: dict[str, object] = {}
    for qt in args.query_thresholds:
        for fk in args.first_k:
            runs[qt, fk] = {}
            for ds in args.datasets:
                dev = dataset_file(args.data, ds, "dev")
                questions = load_questions(dev, limit=args.limit)
                # one row per question as it finishes: a killed tuning run resumes mid-dataset
                name = f"runs_q{qt}_{ds}.jsonl" if fk is None else f"runs_q{qt}_fk{fk}_k{args.k}_{ds}.jsonl"
                with ResultLog(args.output / name, key=lambda r: r["qid"]) as log:
                    todo = [q for q in questions if q.id not in log]
                    if todo:
                        if ds not in setups:
                            setups[ds] = RunSetup.build(questions, corpus_from=[dataset_file(args.data, ds, "train"),
                                                                                dev], retriever="bm25", cache=False)
                        setup = setups[ds]
                        runner = IRRRRunner(model, setup.retriever,
                                            IRRRConfig(k=args.k, first_k=fk, max_path=args.max_path,
                                                       query_threshold=qt, answer_threshold=float("inf")))
                        for q, g in zip(setup.questions, setup.gold):
                            if q.id in log:
                                continue
                            r = runner.run([q.question])[0]
                            log.append({"qid": q.id, "answers": q.answers, "gold": g, "steps": r["steps"]})
                    rows = [log.get(q.id) for q in questions]
                runs[qt, fk][ds] = rows
                print(f"query_threshold={qt} first_k={fk} {ds}: {len(rows)} questions run to the cap", file=sys.stderr)
    grid = []
    for (qt, fk), by_ds in runs.items():
        for at, fo in [(at, fo) for at in args.answer_thresholds for fo in args.fill_order]:
            entry = {"query_threshold": qt, "first_k": fk, "answer_threshold": at, "fill_order": fo}
            for ds, rows in by_ds.items():
                res = [replay(r["steps"], at, args.return_k, fo) for r in rows]
                n = max(1, len(rows))
                entry[ds] = {"f1": sum(f1(a, r["answers"]) for (a, *_), r in zip(res, rows)) / n,
                             "recall": sum(recall(ids, r["gold"]) for (_, ids, *_), r in zip(res, rows)) / n,
                             "steps": sum(x[2] for x in res) / n, "read": sum(x[3] for x in res) / n,
                             "returned": sum(len(x[1]) for x in res) / n}
            for key in ("f1", "recall", "read"):
                entry[key] = sum(entry[ds][key] for ds in by_ds) / len(by_ds)
            grid.append(entry)
    best = max(grid, key=lambda e: (round(e[args.objective], 6), -e["read"]))
    (args.output / "grid.json").write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                                       "grid": grid}, indent=2))
    cfg = {"query_threshold": best["query_threshold"], "answer_threshold": best["answer_threshold"],
           "max_path": args.max_path, "k": args.k}
    cfg.update({key: value for key, value in (("first_k", best["first_k"]), ("return_k", args.return_k)) if value})
    if args.return_k and best["fill_order"] != "rerank":
        cfg["fill_order"] = best["fill_order"]
    (args.output / "best.json").write_text(json.dumps(cfg, indent=2) + "\n")
    from effrag.evaluation.report import md_table

    head = ["query_threshold", "first_k", "answer_threshold", "fill_order", f"mean {args.objective}", "mean read"]
    head += [f"{ds} {m}" for ds in args.datasets for m in ("recall", "f1", "returned", "read")]
    ranked = sorted(grid, key=lambda e: (-round(e[args.objective], 6), e["read"]))
    table = [[e["query_threshold"], e["first_k"] or args.k, e["answer_threshold"], e["fill_order"],
              f"{e[args.objective]:.4f}",
              f"{e['read']:.1f}"] + [f"{e[ds][m]:.4f}" if m in ("recall", "f1") else f"{e[ds][m]:.1f}"
                                     for ds in args.datasets for m in ("recall", "f1", "returned", "read")]
             for e in ranked]
    (args.output / "table.md").write_text(
        f"IRRR tuning on the first {args.limit} dev questions per dataset, objective mean {args.objective}; "
        f"k={args.k}, max_path={args.max_path}, return_k={args.return_k}. Best first.\n\n"
        + md_table(head, [[str(c) for c in row] for row in table]))
    for e in ranked[:8]:
        print(f"q={e['query_threshold']} fk={e['first_k']} a={e['answer_threshold']} fill={e['fill_order']}: mean F1 {e['f1']:.3f}, "
              f"recall {e['recall']:.3f}, read {e['read']:.1f}; "
              + ", ".join(f"{ds} F1 {e[ds]['f1']:.3f} R {e[ds]['recall']:.3f} steps {e[ds]['steps']:.2f}"
                          for ds in args.datasets))
    print("best:", json.dumps(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
