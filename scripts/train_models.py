"""Train any effrag model with train.py and install its best checkpoint with a model card.

    nice python scripts/train_models.py --name all                       # Labeler + Filter, CPU configs, 1 process
    nice python scripts/train_models.py --name all --processes 2         # 2 gloo processes on CPU
    python scripts/train_models.py --name all --paper --launch-args "--multi_gpu --num_processes 4"
    python scripts/train_models.py --name all -- --data.max_train_examples 3000   # overrides for every model
    python scripts/train_models.py --name hotpotqa --synth runs/synth/train_hotpotqa  # per-dataset data
    python scripts/train_models.py --models irrr --name all --processes 2   # IRRR -> checkpoints/irrr-all
    python scripts/train_models.py --models reader --name all --processes 2   # reader -> checkpoints/reader-all
    python scripts/train_models.py --models irrr,reader --name all --dry-run   # print the commands, run nothing

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
   versions, metrics, the commands), written from the run's own files; then the model's after-install step, if
   it has one (the reader: ``scripts/tune_reader.py --write`` tunes its span decoding into ``<folder>/decoding``).

``--dry-run`` prints, per model, the data-step commands and the ``accelerate launch train.py`` command (and the
step run on the installed folder) without running or installing anything.

What each model is and its card: :mod:`effrag.training.cards`; the recipe (commands, install) is this file.
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

from effrag.cli_args import add_data_dir_arg, add_datasets_arg
from effrag.pretrained import LOOP_DATASETS
from effrag.provenance import DATA_ROOT, portable_text
from effrag.training.cards import MODELS, card_describes_run, model_card

REPO = Path(__file__).resolve().parents[1]  # the checkout: train.py, configs/, checkpoints/, runs/
BIN = Path(sys.executable).parent
DATASETS = LOOP_DATASETS  # the recipe's train sets: those a shipped system has a loop-<dataset>.json for


# -- the recipe's commands -----------------------------------------------------------------------------------
def data_tag(recipe) -> str:
    return "all" if sorted(recipe.datasets) == sorted(DATASETS) else "+".join(recipe.datasets)


def data_paths(recipe, model: str) -> tuple[str, list[str]]:
    """Training file and eval files (repo-relative) of the IRRR / reader data step."""
    train = f"runs/{model}/train_{data_tag(recipe)}/{model}.jsonl"
    return train, [f"runs/{model}/dev_{d}/{model}.jsonl" for d in recipe.datasets]


# the distilled rankers: the installed model each one starts from (the teacher; then the student, trained further on
# the loop's own groups; the 3-layer one from the teacher, on the loop's groups)
STARTS_FROM = {"ranker_distilled": "ranker", "ranker_distilled_loop": "ranker_distilled", "ranker_distilled3": "ranker"}


def role_overrides(recipe, role: str, extra: list[str]) -> list[str]:
    """train.py overrides for one model: its data files, the shared overrides, then the Labeler-only ones."""
    if role in ("irrr", "reader"):
        train, evals = data_paths(recipe, role)
        out = ["--data.train_file", train, "--data.eval_files", ",".join(evals)]
    elif role == "ranker":
        out = ["--data.train_file", str(Path(recipe.ranker_data) / "ranker.jsonl")] if recipe.ranker_data else []
    elif role == "late_ranker":  # the groups the teacher scored, from the packaged MiniLM (its config's encoder)
        out = ["--data.train_file", str(Path(recipe.teacher_data) / "ranker.jsonl")] if recipe.teacher_data else []
    elif role in STARTS_FROM:  # groups scored by the teacher, from the model installed before
        out = ["--data.train_file", str(Path(recipe.teacher_data) / "ranker.jsonl")] if recipe.teacher_data else []
        out += ["--model.name_or_path", "checkpoints/" + MODELS[STARTS_FROM[role]].checkpoint.format(name=recipe.name)]
    else:
        out = ["--data.train_file", str(Path(recipe.synth) / f"{role}.jsonl")] if recipe.synth else []
    out += list(extra)
    if role == "labeler":
        out += shlex.split(recipe.labeler_overrides)
    return out


# -- training -----------------------------------------------------------------------------------------
def launch_command(recipe, role: str, out_dir: Path, extra: list[str], fresh: bool = False) -> tuple[list[str], dict]:
    """``accelerate launch train.py`` for one model (resuming its latest checkpoint unless ``fresh``), and its
    environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launcher = [str(BIN / "accelerate"), "launch"]
    if recipe.launch_args:
        launcher += shlex.split(recipe.launch_args)
    elif recipe.processes > 1:
        # `--cpu --num_processes N` silently runs one process; this gives N gloo processes on CPU
        env["ACCELERATE_USE_CPU"] = "true"
        env.setdefault("OMP_NUM_THREADS", "1")
        launcher += ["--multi_gpu", "--num_processes", str(recipe.processes)]
    else:
        launcher += ["--num_processes", "1"]
    launcher += ["--num_machines", "1", "--dynamo_backend", "no"]
    # relative to the repo (every run starts there): the paths the checkpoint's effrag_config.json records
    config = Path("configs") / (f"{role}_paper.yaml" if recipe.paper else f"{role}.yaml")
    cmd = [*launcher, "train.py", "--config", str(config), "--output_dir",
           str(out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir), *extra]
    if not fresh and (out_dir / "checkpoints").is_dir() \
            and any((out_dir / "checkpoints").glob("step_*/trainer_state.json")):
        cmd += ["--resume_from_checkpoint", "latest"]
    return cmd, env


def command_line(cmd: list[str], nice: bool = True) -> str:
    """A command as a user would type it from the repo root."""
    text = shlex.join(cmd).replace(str(BIN) + "/", "").replace(str(REPO) + "/", "")
    prefix = "ACCELERATE_USE_CPU=true " if "--multi_gpu" in cmd and "--use_deepspeed" not in cmd else ""
    return f"{prefix}{'nice ' if nice else ''}{text}"


# -- after install ---------------------------------------------------------------------------------
# a script run on the installed folder ({path}; {data}: --data, the card's copy says ../shared/data)
AFTER_INSTALL = {
    # span decoding (question-echo and length penalties) tuned on the dev files' oracle reading
    "reader": ("scripts/tune_reader.py", "--reader", "{path}", "--data", "{data}", "--write",
               "--output", "{path}/decoding"),
}


def after_install_command(role: str, where: str, data: str) -> list[str]:
    return [a.format(path=where, data=data) for a in AFTER_INSTALL.get(role, ())]


def install(recipe, role: str, out_dir: Path, cmd: list[str], wall: float | None, data_commands: list[str],
            argv: list[str] = ()) -> Path:
    """Copy the run's best checkpoint to checkpoints/ with its card, then run the model's after-install step
    (``argv``: the recipe command's arguments, for the card).

    A reused run (``wall`` None: it had finished before this invocation) keeps the card already installed
    beside it, which describes the invocation that trained it."""
    spec = MODELS[role]
    dest = REPO / "checkpoints" / spec.checkpoint.format(name=recipe.name)
    card = dest / "README.md"
    # a reused run keeps its installed card, unless the folder holds another run's model (two roles share ranker/)
    run = str(out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir)
    old_card = card.read_text() if wall is None and card.is_file() else None
    if old_card is not None and not card_describes_run(old_card, run):
        old_card = None
    shutil.rmtree(dest, ignore_errors=True)
    which = recipe.install or spec.install or "best"
    shutil.copytree(out_dir / which, dest)
    again = "python " + shlex.join(["scripts/train_models.py", *argv]).replace(str(REPO) + "/", "")
    # the card is committed (and may ship): paths relative to the repo or the data root, never this machine's
    where = "checkpoints/" + spec.checkpoint.format(name=recipe.name)
    commands = [*data_commands, command_line(cmd)]
    if role in AFTER_INSTALL:
        commands.append(command_line(["python", *after_install_command(role, where, DATA_ROOT)], nice=False))
    card.write_text(portable_text(old_card or model_card(recipe.name, role, out_dir, commands, wall, again, which)))
    if role in AFTER_INSTALL:
        # training does not refuse an uncommitted tree, so neither does its step: its report gets the diff beside it
        step = [sys.executable, *after_install_command(role, str(dest.relative_to(REPO)), str(recipe.data)),
                "--allow-dirty"]
        print("+", shlex.join(step), flush=True)
        subprocess.run(step, cwd=REPO, check=True)
    return dest


# -- data ------------------------------------------------------------------------------------------
def dataset_file(args, dataset: str, split: str) -> str:
    return str(Path(args.data) / dataset / f"{split}.jsonl")


def data_steps(args, model: str) -> list[tuple[str, list[str] | None, tuple]]:
    """The model's data steps, if it has any: (the command line, for the card; the command run, or None for the
    reader's in-process call; that call's arguments)."""
    if model not in ("irrr", "reader"):
        return []
    train, evals = data_paths(args, model)
    # (inputs, output folder, IRRR's BM25 corpus files, questions per input)
    jobs = [([dataset_file(args, d, "train") for d in args.datasets], Path(train).parent, [], None)]
    for d, e in zip(args.datasets, evals):  # dev: the first questions, over their own dataset's paragraphs
        dev = dataset_file(args, d, "dev")
        jobs.append(([dev], Path(e).parent, [dataset_file(args, d, "train"), dev], args.dev_limit))
    steps = []
    for inputs, out, corpus_from, limit in jobs:
        if model == "irrr":  # resumes by itself: always run
            cmd = [str(BIN / "effrag"), "irrr-data", "--inputs", *inputs]
            cmd += (["--corpus-from", *corpus_from] if corpus_from else []) + (["--limit", str(limit)] if limit else [])
            cmd += ["--output", str(out), "--quiet"]
            steps.append((command_line(cmd, nice=False), cmd, ()))
        else:  # seconds, and seeded: rebuilt every time, so the files always match --data
            call = f"write_reader_data({json.dumps(inputs)}, {json.dumps(str(out))}, limit={limit})"
            steps.append((f"python -c 'from data_synthesis.reader_records import write_reader_data; {call}'", None,
                          (call, inputs, out, limit)))
    return steps


def prepare_data(args, model: str) -> list[str]:
    """Build the model's training and dev files if it has a data step; returns the commands run (for the card)."""
    commands = []
    for text, cmd, call in data_steps(args, model):
        if cmd is not None:
            print("+", shlex.join(cmd), flush=True)
            subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
        else:
            from data_synthesis.reader_records import write_reader_data

            call, inputs, out, limit = call
            print("+", call, flush=True)
            write_reader_data([REPO / f for f in inputs], REPO / out, limit=limit)
        commands.append(text)
    return commands


def dry_run(args, roles: list[str], extra: list[str]) -> int:
    """Print each model's data-step commands, its training command and its after-install step; run nothing."""
    for role in roles:
        out_dir = REPO / "runs" / "train" / args.name / role
        cmd, _ = launch_command(args, role, out_dir, role_overrides(args, role, extra), fresh=args.force)
        finished = not args.force and (out_dir / "results.json").is_file()
        where = "checkpoints/" + MODELS[role].checkpoint.format(name=args.name)
        print(f"# {role} -> {where}" + (" (its run has finished: reused, not retrained)" if finished else ""))
        for text, _, _ in data_steps(args, role):
            print(text)
        print(command_line(cmd))
        if role in AFTER_INSTALL:
            print(command_line(["python", *after_install_command(role, where, str(args.data))], nice=False))
    return 0


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
                   "(ranker_distilled) trains on DIR/ranker.jsonl, from the installed teacher; "
                   "ranker_distilled_loop, from the installed student; ranker_distilled3, from the installed teacher; "
                   "late_ranker, from MiniLM")
    p.add_argument("--synth", metavar="DIR", help="synthesis output dir: Labeler/Filter train on DIR/<model>.jsonl")
    p.add_argument("--labeler-overrides", default="", metavar="ARGS",
                   help="overrides for the Labeler only, e.g. '--model.name_or_path smollm2 --train.lr 5e-5'")
    add_data_dir_arg(p)
    add_datasets_arg(p, DATASETS, help="train sets pooled by the IRRR and reader data (a,b,c or a b c)")
    p.add_argument("--dev-limit", type=int, default=60, help="dev questions per dataset for IRRR / reader validation")
    p.add_argument("--dry-run", action="store_true",
                   help="print each model's data, training and after-install commands; run and install nothing")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="after --: train.py overrides for every model")
    args = p.parse_args()
    extra = [a for a in args.overrides if a != "--"]
    roles = args.models.split(",")
    for role in roles:
        if role not in MODELS:
            p.error(f"unknown model {role!r}; choose from {', '.join(MODELS)}")
        if args.paper and not MODELS[role].paper_config:
            p.error(f"--paper: there is no configs/{role}_paper.yaml")
    if args.dry_run:
        return dry_run(args, roles, extra)
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
