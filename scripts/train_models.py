"""Train any effrag model with train.py and install its best checkpoint with a model card.

    nice python scripts/train_models.py --name all                       # Labeler + Filter, CPU configs, 1 process
    nice python scripts/train_models.py --name all --processes 2         # 2 gloo processes on CPU
    python scripts/train_models.py --name all --paper --launch-args "--multi_gpu --num_processes 4"
    python scripts/train_models.py --name all -- --data.max_train_examples 3000   # overrides for every model
    python scripts/train_models.py --name hotpotqa --synth runs/synth/train_hotpotqa  # per-dataset data
    python scripts/train_models.py --models irrr --name all --processes 2   # IRRR -> checkpoints/irrr-all
    python scripts/train_models.py --models reader --name all --processes 2   # reader -> checkpoints/reader-all

Per model, in order:

1. data: Labeler / Filter train on the synthesised ``--synth DIR/<model>.jsonl`` (``effrag synthesize``;
   scripts/train_efficientrag.sh runs the whole EfficientRAG recipe) or their config's files; IRRR's
   dynamic-oracle steps are built with ``effrag irrr-data`` (resumes), the reader's records with
   ``data_synthesis.reader_records.write_reader_data`` (seconds, seeded), both from the
   ``--datasets`` train files in ``--data`` (env DATA, default ../shared/data), with the first
   ``--dev-limit`` dev questions of each dataset for validation;
2. ``accelerate launch train.py --config configs/<model>.yaml`` into runs/train/<name>/<model>; a run
   that stopped resumes from its latest checkpoint, a finished run is reused (``--force`` retrains);
3. the best checkpoint is copied to its place under checkpoints/ (efficientrag-<name>/<labeler|filter>,
   irrr-<name>, reader-<name>) with a model card, README.md (data and hashes, training settings,
   versions, metrics, the commands), written from the run's own files.

What each model is, its training command, the install and the card: :mod:`effrag.training.install`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from effrag.training.install import (BIN, DATASETS, MODELS, REPO, command_line, data_paths, install,
                                     launch_command, role_overrides)


# -- data ------------------------------------------------------------------------------------------
def dataset_file(args, dataset: str, split: str) -> str:
    return str(Path(args.data) / dataset / f"{split}.jsonl")


def prepare_data(args, model: str) -> list[str]:
    """Build the model's training and dev files if it has a data step; returns the commands run (for the card)."""
    if model not in ("irrr", "reader"):
        return []
    train, evals = data_paths(args, model)
    # (inputs, output folder, IRRR's BM25 corpus files, questions per input)
    jobs = [([dataset_file(args, d, "train") for d in args.datasets], Path(train).parent, [], None)]
    for d, e in zip(args.datasets, evals):  # dev: the first questions, over their own dataset's paragraphs
        dev = dataset_file(args, d, "dev")
        jobs.append(([dev], Path(e).parent, [dataset_file(args, d, "train"), dev], args.dev_limit))
    commands = []
    for inputs, out, corpus_from, limit in jobs:
        if model == "irrr":  # resumes by itself: always run
            cmd = [str(BIN / "effrag"), "irrr-data", "--inputs", *inputs]
            cmd += (["--corpus-from", *corpus_from] if corpus_from else []) + (["--limit", str(limit)] if limit else [])
            cmd += ["--output", str(out), "--quiet"]
            print("+", shlex.join(cmd), flush=True)
            subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
            commands.append(command_line(cmd, nice=False))
        else:  # seconds, and seeded: rebuilt every time, so the files always match --data
            from data_synthesis.reader_records import write_reader_data

            call = f"write_reader_data({json.dumps(inputs)}, {json.dumps(str(out))}, limit={limit})"
            print("+", call, flush=True)
            write_reader_data([REPO / f for f in inputs], REPO / out, limit=limit)
            commands.append(f"python -c 'from data_synthesis.reader_records import write_reader_data; {call}'")
    return commands


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="labeler,filter", help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--name", default="all", help="run and checkpoint name: runs/train/<name>, checkpoints/...-<name>")
    p.add_argument("--processes", type=int, default=1, help="CPU processes (gloo DDP)")
    p.add_argument("--launch-args", default="", help="raw accelerate launch arguments (GPU/DeepSpeed setups)")
    p.add_argument("--paper", action="store_true", help="use configs/*_paper.yaml (DeBERTa-v3-large; GPUs)")
    p.add_argument("--force", action="store_true", help="retrain even if the run finished")
    p.add_argument("--install", choices=("best", "last"), default=None,
                   help="the run's checkpoint to install: best by the dev records' metric, or the end of the schedule "
                        "(default: best; last for the ranker)")
    p.add_argument("--ranker-data", metavar="DIR", help="`effrag ranker-data` output: the ranker trains on DIR/ranker.jsonl")
    p.add_argument("--teacher-data", metavar="DIR", help="`effrag ranker-teacher` output: the distilled ranker "
                   "(ranker_distilled) trains on DIR/ranker.jsonl, from the installed teacher")
    p.add_argument("--synth", metavar="DIR", help="synthesis output dir: Labeler/Filter train on DIR/<model>.jsonl")
    p.add_argument("--labeler-overrides", default="", metavar="ARGS",
                   help="overrides for the Labeler only, e.g. '--model.name_or_path smollm2 --train.lr 5e-5'")
    p.add_argument("--data", default=os.environ.get("DATA", "../shared/data"), metavar="DIR",
                   help="dataset folder (<dataset>/{train,dev}.jsonl) of the IRRR and reader data steps")
    p.add_argument("--datasets", default=",".join(DATASETS), help="train sets pooled by the IRRR and reader data")
    p.add_argument("--dev-limit", type=int, default=60, help="dev questions per dataset for IRRR / reader validation")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="after --: train.py overrides for every model")
    args = p.parse_args()
    args.datasets = [d for d in args.datasets.split(",") if d]
    extra = [a for a in args.overrides if a != "--"]
    roles = args.models.split(",")
    for role in roles:
        if role not in MODELS:
            p.error(f"unknown model {role!r}; choose from {', '.join(MODELS)}")
        if args.paper and not MODELS[role].paper_config:
            p.error(f"--paper: there is no configs/{role}_paper.yaml")
    for role in roles:
        out_dir = REPO / "runs" / "train" / args.name / role
        if args.force:
            shutil.rmtree(out_dir, ignore_errors=True)
        data_commands = prepare_data(args, role)
        cmd, env = launch_command(args, role, out_dir, role_overrides(args, role, extra))
        wall = None
        if not (out_dir / "results.json").is_file():
            print("+", shlex.join(cmd), flush=True)
            t0 = time.time()
            subprocess.run(cmd, cwd=REPO, env=env, check=True)
            wall = time.time() - t0
        print(f"{role}: {install(args, role, out_dir, cmd, wall, data_commands, sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
