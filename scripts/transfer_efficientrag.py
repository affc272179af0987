#!/usr/bin/env python
"""Out-of-domain transfer of EfficientRAG checkpoints (the paper's Table 6 shape).

Every model pair (Labeler + Filter) runs the LLM-free loop on every dataset's dev
file, with that dataset's corpus (train + dev contexts) and the same retriever and
loop config for all models, so a row differs only in the training data. Each cell
(model, dataset) is appended to ``results.jsonl`` as it finishes; a rerun skips
finished cells. ``report.md`` is the matrix of recall / average chunks.

    python scripts/transfer_efficientrag.py --data ../shared/data \\
        --models all=checkpoints/efficientrag-all hotpotqa=checkpoints/efficientrag-hotpotqa ... \\
        --config hotpotqa=reports/archive/efficientrag/tune-hotpotqa/best.json musique=... \\
        --limit 200 --output reports/efficientrag/transfer
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"bad --{what} item {item!r}: expected NAME=PATH")
        out[name] = value
    return out


def model_dirs(path: str) -> tuple[Path, Path]:
    """``DIR`` holding ``labeler/`` and ``filter/``, or ``LABELER_DIR,FILTER_DIR``."""
    from effrag.models import CONFIG_NAME, is_checkpoint

    lab, _, fil = path.partition(",")
    lab_dir, fil_dir = (Path(lab), Path(fil)) if fil else (Path(path) / "labeler", Path(path) / "filter")
    for d in (lab_dir, fil_dir):
        if not is_checkpoint(d):
            raise SystemExit(f"{d}: not an effrag checkpoint (no {CONFIG_NAME})")
    return lab_dir, fil_dir


def render(rows: list[dict], models: list[str], datasets: list[str]) -> str:
    from effrag.evaluation.report import md_table

    cell = {(r["model"], r["dataset"]): r for r in rows}
    body = [[m, *(f"{100 * r['recall']:.2f} / {r['avg_chunks']:.2f}" if (r := cell.get((m, d))) else "-"
                  for d in datasets)] for m in models]
    return md_table(["trained on \\ evaluated on", *datasets], body).rstrip("\n")


def main(argv=None) -> int:
    from effrag.cli_args import (
        add_batch_size_arg,
        add_bf16_arg,
        add_data_dir_arg,
        add_datasets_arg,
        add_limit_arg,
        add_output_arg,
        add_retriever_arg,
        add_source_args,
    )
    from effrag.provenance import report_source

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_dir_arg(p)
    add_datasets_arg(p, only_these=True)
    p.add_argument("--models", nargs="+", required=True, metavar="NAME=DIR",
                   help="DIR with labeler/ and filter/ (or LABELER,FILTER)")
    p.add_argument("--config", nargs="*", default=[], metavar="DATASET=JSON",
                   help="loop config per evaluated dataset (e.g. the tuner's best.json); default: the loop defaults")
    add_retriever_arg(p, "dense", choices=["dense", "bm25"])
    add_bf16_arg(p, help="bf16 autocast for the dense encoder and the models")
    add_limit_arg(p, 0, help="first N dev questions per dataset", zero_all=True)
    add_batch_size_arg(p, 32, of="questions per loop call")
    add_output_arg(p, required=True)
    add_source_args(p)
    args = p.parse_args(argv)
    commit = report_source(args.output, args.allow_dirty)

    import logging

    from tqdm.auto import tqdm

    from effrag.data import load_questions
    from effrag.evaluation.metrics import recall
    from effrag.jsonl import ResultLog
    from effrag.pipelines.efficientrag import EfficientRAGLoop, build_config, load_models
    from effrag.provenance import command_line
    from effrag.setup import RunSetup, dataset_file

    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    models = {name: model_dirs(path) for name, path in pairs(args.models, "models").items()}
    configs = pairs(args.config, "config")
    unknown = sorted(set(configs) - set(args.datasets))
    if unknown:
        raise SystemExit(f"--config names datasets not evaluated: {unknown}")
    cell_key = lambda r: (r["model"], r["dataset"], json.dumps(r["setup"], sort_keys=True))  # noqa: E731
    rows, loaded = [], {}
    with ResultLog(args.output / "results.jsonl", cell_key, hint="delete the line to rerun that cell") as done:
        for ds in args.datasets:
            dev, train = dataset_file(args.data, ds, "dev"), dataset_file(args.data, ds, "train")
            questions = load_questions(dev, ds, limit=args.limit or None)
            cfg = build_config(configs.get(ds), bf16=args.bf16 or None)
            setup = {"questions": str(dev.resolve()), "n": len(questions), "retriever": args.retriever,
                     "config": cfg.to_json()}
            key = json.dumps(setup, sort_keys=True)
            todo = [m for m in models if (m, ds, key) not in done]
            rows += [done.get((m, ds, key)) for m in models if (m, ds, key) in done]
            if not todo:
                continue
            run = RunSetup.build(questions, corpus_from=[train, dev], dataset=ds, retriever=args.retriever,
                                 bf16=args.bf16)  # gold missing from the corpus counts as missed, as in `effrag eval`
            for m in todo:
                if m not in loaded:  # each pair loads once, whatever the number of datasets
                    loaded[m] = load_models(*map(str, models[m]))
                loop = EfficientRAGLoop(*loaded[m], run.retriever, cfg)
                t0 = time.perf_counter()
                results = []
                for i in tqdm(range(0, len(run.texts), args.batch_size), desc=f"{m} on {ds}", unit="batch"):
                    results += loop.run(run.texts[i: i + args.batch_size])
                n = len(results)
                row = {"model": m, "dataset": ds, "setup": setup, "labeler": str(models[m][0]),
                       "filter": str(models[m][1]),
                       "recall": sum(recall([c.id for c in r.chunks], g) for r, g in zip(results, run.gold)) / n,
                       "avg_chunks": sum(len(r.chunks) for r in results) / n,
                       "iterations": sum(r.iterations for r in results) / n, "seconds": time.perf_counter() - t0,
                       "commit": commit}
                done.append(row)
                rows.append(row)
    table = render(rows, list(models), args.datasets)
    counts = {d: next(r["setup"]["n"] for r in rows if r["dataset"] == d) for d in args.datasets
              if any(r["dataset"] == d for r in rows)}
    cmd = command_line(argv)
    text = "\n".join([
        "# EfficientRAG transfer: recall % / average chunks (rows: training data; columns: dev file evaluated)", "",
        table, "",
        f"Retriever: {args.retriever} over each dataset's train + dev contexts; "
        f"{f'the first {args.limit} (or all, if fewer)' if args.limit else 'all'} dev questions per dataset "
        f"({', '.join(f'{d} {n}' for d, n in counts.items())}); "
        "loop config per evaluated dataset: " + (", ".join(f"{d}: `{c}`" for d, c in configs.items()) or "defaults") + ".",
        "", f"Command: `{cmd}`, at commit {commit}.", ""])
    (args.output / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
