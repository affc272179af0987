#!/usr/bin/env python
"""The set-wise pool ranker (issue #70): dump the loop's pools, train on train questions, score dev folds.

    # 1. each question's top candidates under a shipped loop config (one loop run; resumable per file)
    python scripts/set_ranker.py dump --er-config effrag/pretrained/efficientrag-all/loop-hotpotqa.json \\
        --questions ../shared/data/hotpotqa/train.jsonl \\
        --corpus-from ../shared/data/hotpotqa/train.jsonl ../shared/data/hotpotqa/dev.jsonl \\
        --retriever hybrid --encoder e5-small --bf16 --er-bf16 --out runs/set/hotpotqa-train.jsonl
    # 2. train on train dumps only
    python scripts/set_ranker.py train --train runs/set/*-train.jsonl --out runs/set/model
    # 3. score dev dumps: recall at 1..10 of the pool order and of the model's, per question
    python scripts/set_ranker.py score --model runs/set/model --dumps runs/set/*-dev.jsonl --out runs/set/scores.jsonl

The dump keeps the loop's raw records (:func:`effrag.pipelines.efficientrag.pool.pool_candidates`), not features,
so a change of features never reruns the loop.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOP = 30

from effrag.cli_args import (  # noqa: E402 (no torch: the help prints without it)
    DATASETS,
    add_batch_size_arg,
    add_keep_sample_arg,
    add_output_arg,
    add_source_args,
    add_system_arg,
)
from effrag.provenance import committed_source, report_source  # noqa: E402


def dump(argv) -> int:
    from effrag.cli_args import add_method_args, add_run_args

    p = argparse.ArgumentParser(prog="set_ranker.py dump")
    add_run_args(p, sample=True, retriever_default="hybrid")
    add_method_args(p, "efficientrag")
    p.add_argument("--grid", nargs="*", default=[], metavar="NAME=V", help="loop options over the config's")
    p.add_argument("--top", type=int, default=TOP)
    add_batch_size_arg(p, 64, of="questions per loop call")
    add_output_arg(p, required=True, dest="out", metavar="FILE", help="the dump (JSONL; resumed), its .meta.json beside it")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = committed_source(args.allow_dirty)
    import logging
    from dataclasses import replace

    from effrag.cli_args import method_options
    from effrag.pipelines import build_pipeline
    from effrag.pipelines.efficientrag.pool import pool_candidates
    from effrag.pipelines.efficientrag.system import DEFAULT_SYSTEM, open_system
    from effrag.provenance import portable
    from effrag.setup import RunSetup
    from effrag.tuning import parse_grid

    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    system = open_system(args.model or DEFAULT_SYSTEM, args.er_config)
    args.labeler, args.filter, args.ranker = system.labeler, system.filter, args.ranker or system.ranker
    args.model = None
    run = RunSetup.from_args(args, own_contexts=True)
    loop = build_pipeline("efficientrag", run.retriever, **method_options(args)).loop
    if args.grid:
        (changes,) = parse_grid(args.grid)
        loop.config = replace(loop.config, **changes)
    done = set()
    if args.out.exists():
        done = {json.loads(line)["id"] for line in args.out.read_text().splitlines() if line.strip()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    todo = [i for i, q in enumerate(run.questions) if q.id not in done]
    t0 = time.time()
    with args.out.open("a") as f:
        for b in range(0, len(todo), args.batch_size):
            idx = todo[b: b + args.batch_size]
            states = loop.run_states([run.texts[i] for i in idx])
            for i, s in zip(idx, states):
                queries = [q for e in s.trace for q in e.get("next_queries", [])]
                f.write(json.dumps({"id": run.questions[i].id, "question": s.question, "queries": queries,
                                    "gold": list(run.gold[i]),
                                    "records": pool_candidates(s, loop.config, args.top)}) + "\n")
            f.flush()
            print(f"{b + len(idx)}/{len(todo)} questions, {time.time() - t0:.0f} s", file=sys.stderr)
    if todo or not args.out.with_suffix(".meta.json").is_file():  # a resumed dump keeps the commit it began at
        meta = {"config": loop.config.to_json(), "setup": run.identity(), "top": args.top, "commit": commit,
                "command": "python scripts/set_ranker.py dump " + " ".join(map(str, argv))}
        args.out.with_suffix(".meta.json").write_text(json.dumps(portable(meta), indent=2) + "\n")
    return 0


def read_dump(path: Path) -> list[dict]:
    from effrag.models.set_ranker import candidate_features

    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not JSON ({e.msg})")
        feats, links = candidate_features(q["question"], q["queries"], q["records"])
        gold = set(q["gold"])
        q.update(feats=feats, links=links, labels=[int(r["id"] in gold) for r in q["records"]],
                 dataset=path.name.split("-")[0])
        out.append(q)
    return out


def read_text(path: Path) -> str:
    """A text file, gunzipped when its name ends in .gz (the committed scores)."""
    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def recall_curve(ids: list[str], gold: list[str], k_max: int = 10) -> list[float]:
    """Recall of ``ids`` cut at 1..``k_max`` (:func:`effrag.evaluation.metrics.recall`)."""
    from effrag.evaluation.metrics import recall

    return [recall(ids[:k], gold) for k in range(1, k_max + 1)]


def fit(data: list[dict], args, seed: int):
    """One model trained on ``data`` (dumped sets) with ``args``' shape and schedule."""
    import torch

    from effrag.models import set_ranker as sr

    torch.manual_seed(seed)
    rng = random.Random(seed)
    data = [q for q in data if any(q["labels"]) and not all(q["labels"])]  # a set with no contrast teaches nothing
    drop = [sr.FEATURE_NAMES.index(n) for n in args.drop]
    model = sr.build_model(dim=args.dim, layers=args.layers, set_wise=not args.pointwise)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps = args.epochs * ((len(data) + 31) // 32)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.1)
    data = list(data)
    for _ in range(args.epochs):
        rng.shuffle(data)
        model.train()
        for b in range(0, len(data), 32):
            x, links, pad, gold = sr.collate([(q["feats"], q["links"], q["labels"]) for q in data[b: b + 32]], TOP)
            x[..., drop] = 0.0
            if args.no_links:
                links.zero_()
            loss = sr.set_loss(model(x, links, pad), gold, pad)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def model_scores(model, q: dict, drop: list[str], no_links: bool) -> list[float]:
    import torch

    from effrag.models import set_ranker as sr

    x, links, pad, _ = sr.collate([(q["feats"], q["links"], q["labels"])], TOP)
    x[..., [sr.FEATURE_NAMES.index(n) for n in drop]] = 0.0
    if no_links:
        links.zero_()
    with torch.inference_mode():
        return model(x, links, pad)[0, : len(q["records"])].tolist()


def reordered(q: dict, scores: list[float], m: int) -> list[str]:
    """The pool's first ``m`` ids in the model's order, then the rest in the pool's."""
    ids = [r["id"] for r in q["records"]]
    return [ids[i] for i in sorted(range(min(m, len(ids))), key=lambda i: -scores[i])] + ids[m:]


def train(argv) -> int:
    p = argparse.ArgumentParser(prog="set_ranker.py train")
    p.add_argument("--train", nargs="+", type=Path, required=True, help="dumps of train questions only")
    add_output_arg(p, required=True, dest="out", help="the trained model's folder")
    p.add_argument("--pointwise", action="store_true", help="the control: no attention over the set")
    p.add_argument("--drop", nargs="*", default=[], help="features zeroed (ablation), e.g. linked_rel named_by_top")
    p.add_argument("--no-links", action="store_true", help="no link-biased attention (links matrix zeroed)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seeds", type=int, default=1, help="models averaged (an ensemble of seeds 0..N-1)")
    add_source_args(p)
    p.add_argument("--cv", type=int, default=0, help="k-fold cross-validation over the train questions instead: "
                   "held-out recall at 5 / 7 / 10 of the pool and of the model over the pool's first 10")
    args = p.parse_args(argv)
    from effrag.models import set_ranker as sr
    from effrag.provenance import portable, provenance
    from effrag.tuning.crossfit import folds

    commit = committed_source(args.allow_dirty)
    data = [q for f in args.train for q in read_dump(f)]
    if args.cv:
        fold_of = folds([f"{q['dataset']}:{q['id']}" for q in data], args.cv, 0)
        curves: dict[str, list] = {}
        for f in range(args.cv):
            inside = [q for q in data if fold_of[f"{q['dataset']}:{q['id']}"] != f]
            models = [fit(inside, args, s) for s in range(args.seeds)]
            for q in data:
                if fold_of[f"{q['dataset']}:{q['id']}"] == f:
                    s = [sum(v) for v in zip(*(model_scores(m, q, args.drop, args.no_links) for m in models))]
                    for key in ("all", q["dataset"]):
                        curves.setdefault(f"{key} pool", []).append(
                            recall_curve([r["id"] for r in q["records"]], q["gold"]))
                        curves.setdefault(f"{key} model", []).append(recall_curve(reordered(q, s, 10), q["gold"]))
        res = {k: [round(100 * sum(c[b - 1] for c in v) / len(v), 2) for b in (5, 7, 10)] for k, v in curves.items()}
        print(json.dumps({"cv": args.cv, "epochs": args.epochs, "pointwise": args.pointwise, "drop": args.drop,
                          "no_links": args.no_links, "seeds": args.seeds, "recall_5_7_10": res}))
        return 0
    t0 = time.time()
    models = [fit(data, args, s) for s in range(args.seeds)]
    info = {"train": [str(f) for f in args.train], "questions": len(data), "epochs": args.epochs, "lr": args.lr,
            "dim": args.dim, "layers": args.layers, "seeds": args.seeds, "drop": args.drop,
            "no_links": args.no_links, "pointwise": args.pointwise, "commit": commit,
            **portable(provenance(files=args.train))}
    if args.seeds == 1:
        sr.save(models[0], args.out, {**info, "seed": 0})
    else:
        sr.save_ensemble(models, args.out, info)
    print(f"trained {args.seeds} model(s) in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


def score(argv) -> int:
    p = argparse.ArgumentParser(prog="set_ranker.py score")
    p.add_argument("--model", type=Path, nargs="+", required=True, help="one or more trained folders")
    p.add_argument("--dumps", nargs="+", type=Path, required=True)
    add_output_arg(p, required=True, dest="out", metavar="FILE", help="the scores (JSONL, gzipped if it ends in .gz)")
    p.add_argument("--tops", default="10,20,30", help="the model reorders the pool's first M, for each M")
    add_source_args(p)
    args = p.parse_args(argv)
    from effrag.models import set_ranker as sr
    from effrag.provenance import file_sha256, portable

    commit = committed_source(args.allow_dirty)
    models = {m.name: (sr.load(m), json.loads((m / sr.CONFIG).read_text())) for m in args.model}
    meta = {"commit": commit, "command": "python scripts/set_ranker.py score " + " ".join(map(str, argv)),
            "models": {m.name: {w.relative_to(m).as_posix(): file_sha256(w) for w in sorted(m.rglob("*.safetensors"))}
                       for m in args.model},
            "dumps": {p.name: json.loads(p.with_suffix(".meta.json").read_text()).get("commit")
                      for p in args.dumps if p.with_suffix(".meta.json").is_file()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(args.out).removesuffix(".gz").removesuffix(".jsonl") + ".meta.json").write_text(
        json.dumps(portable(meta), indent=2) + "\n")
    with (gzip.open(args.out, "wt") if args.out.suffix == ".gz" else args.out.open("w")) as f:
        for path in args.dumps:
            for q in read_dump(path):
                ids = [r["id"] for r in q["records"]]
                row = {"id": q["id"], "dataset": q["dataset"], "dump": path.name, "n": len(ids),
                       "curves": {"pool": recall_curve(ids, q["gold"])}}
                plain = sorted(range(len(ids)), key=lambda i: -q["records"][i]["plain"])
                row["curves"]["pool_no_links"] = recall_curve([ids[i] for i in plain], q["gold"])
                for name, (model, info) in models.items():
                    s = model_scores(model, q, info["provenance"].get("drop", []),
                                     info["provenance"].get("no_links", False))
                    for m in map(int, args.tops.split(",")):
                        row["curves"][f"{name}@{m}"] = recall_curve(reordered(q, s, m), q["gold"])
                f.write(json.dumps(row) + "\n")
    return 0


def report(argv) -> int:
    """Recall at 5 / 7 / 10 of every order, in-sample and cross-fitted, and the shipping rule's decision per unit
    (:mod:`effrag.tuning.set_ranker`); the bundled sample's questions are left out of every fold."""
    p = argparse.ArgumentParser(prog="set_ranker.py report")
    p.add_argument("--scores", nargs="+", type=Path, required=True)
    p.add_argument("--joint", nargs="*", default=[], help="dumps chosen together (loop.json's: one order for all)")
    p.add_argument("--only", nargs="*", default=None, help="orders offered to the rule (default: all); pool always")
    add_output_arg(p, required=True, dest="out", metavar="OUT", help="writes OUT.json (decisions) and OUT.md")
    add_keep_sample_arg(p, help="let the bundled sample's dev questions choose too (a run whose data is the bundled "
                                "sample has no other)")
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.out.parent, args.allow_dirty, name=f"{args.out.name}.uncommitted.diff")
    from effrag.data import sample_question_ids
    from effrag.tuning.set_ranker import RULE_BUDGETS, SHOW_BUDGETS, evaluate_unit, group_rows

    rows = [json.loads(line) for path in args.scores for line in read_text(path).splitlines() if line.strip()]
    if args.only is not None:
        for r in rows:
            r["curves"] = {o: c for o, c in r["curves"].items() if o == "pool" or o in args.only}
    groups = group_rows(rows, () if args.keep_sample else sample_question_ids(DATASETS))
    if not groups:
        sys.exit(f"report: no question of {', '.join(map(str, args.scores))} may choose: they are all the bundled "
                 "sample's, which choose nothing (--keep-sample lets them)")
    units = [[g] for g in sorted(groups) if g not in args.joint]
    if args.joint and (joint := [g for g in args.joint if g in groups]):
        units.append(joint)
    decisions, lines = [], [f"Report built at commit `{commit}`.", ""]
    for path in args.scores:
        meta = Path(str(path).removesuffix(".gz").removesuffix(".jsonl") + ".meta.json")
        if meta.is_file():
            m = json.loads(meta.read_text())
            lines += [f"Scores `{path.name}`: commit `{m['commit']}`; dumps' commits: "
                      f"{sorted(set(map(str, m['dumps'].values())))}.", "", f"    {m['command']}", ""]
    for unit in units:
        d = evaluate_unit(groups, unit)
        decisions.append(d)
        lines += [f"## {' + '.join(unit)}" + (" (one order for all)" if len(unit) > 1 else ""), ""]
        for g in unit:
            lines += [f"**{g}** ({d['n'][g]} questions), in-sample:", "",
                      "| order | " + " | ".join(f"R@{b}" for b in SHOW_BUDGETS) + " |",
                      "|---|" + "---:|" * len(SHOW_BUDGETS)]
            lines += [f"| {o} | " + " | ".join(f"{100 * v[b]:.1f}" for b in SHOW_BUDGETS) + " |"
                      for o, v in d["in_sample"][g].items()]
            lines += ["", "Cross-fitted: " + " / ".join(f"{100 * d['crossfit'][g][b]:.1f}" for b in SHOW_BUDGETS), ""]
        lines += [f"Fold picks (best recall averaged over {', '.join(map(str, RULE_BUDGETS))}): "
                  f"{', '.join(d['fold_picks'])}. Pick on all: {d['pick']}. **Ships: {d['ships']}.**", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(decisions, indent=2) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def ship(argv) -> int:
    """Write each decision into the system's loop config files: ``loop-<dataset>.json`` from its dataset's own dump
    (``<dataset>-dev-own``), ``loop.json`` and every ``loop-<dataset>.json`` that ships loop.json's config from the
    joint one."""
    p = argparse.ArgumentParser(prog="set_ranker.py ship")
    p.add_argument("--decisions", type=Path, required=True, help="report's OUT.json")
    add_system_arg(p, required=True, help="the system folder whose loop config files get the decisions")
    p.add_argument("--report", required=True, help="the report's path, as the loop files record it")
    args = p.parse_args(argv)
    from effrag.tuning.set_ranker import apply_decision

    decisions = json.loads(args.decisions.read_text())
    by_name = {" + ".join(d["unit"]): d for d in decisions}
    joint = next((d for d in decisions if len(d["unit"]) > 1), None)
    general = json.loads((args.system / "loop.json").read_text())
    for f in sorted(args.system.glob("loop*.json")):
        data = json.loads(f.read_text())
        ds = f.stem.removeprefix("loop-") if f.stem != "loop" else None
        same = {k: v for k, v in data["config"].items() if k != "set_ranker_top"} == \
            {k: v for k, v in general["config"].items() if k != "set_ranker_top"}
        d = by_name.get(f"{ds}-dev-own") if ds and not same else joint
        if d is None:
            print(f"{f}: no decision for it; left as it is", file=sys.stderr)
            continue
        f.write_text(json.dumps(apply_decision(data, d, args.report), indent=2) + "\n")
        print(f"{f}: set_ranker_top {d['top']} ({d['ships']})", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmds = {"dump": dump, "train": train, "score": score, "report": report, "ship": ship}
    if not argv or argv[0] not in cmds:
        print(__doc__)
        return 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
