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
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DATASETS = ("hotpotqa", "2wikimqa", "musique")
TOKEN_KEYS = ["token_precision", "token_recall", "token_f1", "token_accuracy"]


class ModelSpec(NamedTuple):
    """What the recipe needs to know about one trainable model besides its config."""

    summary: str  # first sentence of the model card
    checkpoint: str  # install folder under checkpoints/ ({name} is --name)
    metric_keys: list[str]  # columns of the card's metrics table
    metrics_note: str  # what the metrics are
    data_note: str = ""  # how the training file was made
    unit: str = "records"  # what one training example is
    usage: str = ""  # how to use the installed model, beyond load_model ({path} is its folder)
    paper_config: bool = False  # has configs/<model>_paper.yaml
    after_install: tuple = ()  # a script run on the installed folder ({path}, {data}: --data), e.g. tuning
    install: str | None = None  # the checkpoint to install when --install is not given (default: best)


MODELS = {
    "labeler": ModelSpec(
        "EfficientRAG Labeler (token head + <Continue>/<Terminate> chunk head)", "efficientrag-{name}/labeler",
        TOKEN_KEYS + ["tag_accuracy", "tag_continue_f1"], "best checkpoint; word level, positive class = keep",
        paper_config=True),
    "filter": ModelSpec(
        "EfficientRAG Filter (token head)", "efficientrag-{name}/filter", TOKEN_KEYS + ["exact_match"],
        "best checkpoint; word level, positive class = keep", paper_config=True),
    "ranker": ModelSpec(
        "EfficientRAG pool ranker (one relevance logit per (query, chunk), listwise over hard-negative groups)",
        "efficientrag-{name}/ranker", ["top1", "mrr", "gold_in_top3", "rank_loss"],
        "last checkpoint (the end of the schedule: no dev question chooses it), on dev groups from `effrag "
        "ranker-data`; top1: a group's gold ranked first of 8; mrr: mean reciprocal rank of the gold",
        data_note="`effrag ranker-data`: each (query, gold chunk) of the synthesised Labeler records against 7 "
                  "hybrid negatives of the same query (+ the question's own distractors), 2 groups per gold",
        unit="groups", usage="the loop ranks its pool with it (`pool_order: rank`); a system folder's `ranker/`",
        install="last"),
    "irrr": ModelSpec(
        "IRRR (Qi et al., 2021): one encoder with query-term, reader (SPAN/YES/NO/NOANSWER + span) and reranker "
        "heads", "irrr-{name}",
        ["query_token_precision", "query_token_recall", "query_token_f1", "rerank_top1", "type_accuracy",
         "answerable_recall", "span_exact"],
        "best checkpoint, dev steps from `effrag irrr-data` on the first dev questions. query_token_*: oracle "
        "query words; rerank_top1: gold paragraph ranked first among the candidates; answerable_recall: answerable "
        "paths classified SPAN/YES/NO correctly; span_exact: exact start and end",
        data_note="`effrag irrr-data`, dynamic oracle over BM25, recovery augmentation p=0.3, 5 reranker candidates",
        unit="steps", usage="run with `effrag eval --method irrr --irrr-model {path} ...`"),
    "reader": ModelSpec(
        "Extractive reader (start/end span head, [CLS] confidence head f, [CLS] answer-type head span/yes/no; "
        "SearChain's theta = 1.5 applies to f)", "reader-{name}",
        ["answer_exact", "span_exact", "answerable_accuracy", "span_loss", "confidence_loss"],
        "best checkpoint, dev records of the first dev questions. answer_exact: exact span or yes/no type (answering "
        "records); span_exact: best span is the answer (span records); answerable_accuracy: f > 1.5 exactly when "
        "the context answers. QA from gold passages (oracle reading): `python scripts/eval_reader.py`",
        data_note="`write_reader_data`: SQuAD-style spans in gold paragraphs, sub-questions and evidence triples, "
        "the full question over its gold paragraphs read together (span or yes/no; three shuffles, with 1, 0 and 3 "
        "distractors); gold paragraphs without the answer, 1 distractor per question and distractors read together "
        "as no-answer",
        usage="any method answers with it: `effrag eval --method direct-r --reader {path} ...`; SearChain verifies "
        "with it (`--method searchain --reader {path}`)",
        # span decoding (question-echo and length penalties) tuned on the dev files' oracle reading
        after_install=("scripts/tune_reader.py", "--reader", "{path}", "--data", "{data}", "--write",
                       "--output", "{path}/decoding")),
}


# -- data ------------------------------------------------------------------------------------------
def data_tag(args) -> str:
    return "all" if sorted(args.datasets) == sorted(DATASETS) else "+".join(args.datasets)


def data_paths(args, model: str) -> tuple[str, list[str]]:
    """Training file and eval files (repo-relative) of the IRRR / reader data step."""
    train = f"runs/{model}/train_{data_tag(args)}/{model}.jsonl"
    return train, [f"runs/{model}/dev_{d}/{model}.jsonl" for d in args.datasets]


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


def role_overrides(args, role: str, extra: list[str]) -> list[str]:
    """train.py overrides for one model: its data files, the shared overrides, then the Labeler-only ones."""
    if role in ("irrr", "reader"):
        train, evals = data_paths(args, role)
        out = ["--data.train_file", train, "--data.eval_files", ",".join(evals)]
    elif role == "ranker":
        out = ["--data.train_file", str(Path(args.ranker_data) / "ranker.jsonl")] if args.ranker_data else []
    else:
        out = ["--data.train_file", str(Path(args.synth) / f"{role}.jsonl")] if args.synth else []
    out += list(extra)
    if role == "labeler":
        out += shlex.split(args.labeler_overrides)
    return out


# -- training --------------------------------------------------------------------------------------
def launch_command(args, role: str, out_dir: Path, extra: list[str]) -> tuple[list[str], dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launcher = [str(BIN / "accelerate"), "launch"]
    if args.launch_args:
        launcher += shlex.split(args.launch_args)
    elif args.processes > 1:
        # `--cpu --num_processes N` silently runs one process; this gives N gloo processes on CPU
        env["ACCELERATE_USE_CPU"] = "true"
        env.setdefault("OMP_NUM_THREADS", "1")
        launcher += ["--multi_gpu", "--num_processes", str(args.processes)]
    else:
        launcher += ["--num_processes", "1"]
    launcher += ["--num_machines", "1", "--dynamo_backend", "no"]
    # relative to the repo (every run starts there): the paths the checkpoint's effrag_config.json records
    config = Path("configs") / (f"{role}_paper.yaml" if args.paper else f"{role}.yaml")
    cmd = [*launcher, "train.py", "--config", str(config), "--output_dir",
           str(out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir), *extra]
    if (out_dir / "checkpoints").is_dir() and any((out_dir / "checkpoints").glob("step_*/trainer_state.json")):
        cmd += ["--resume_from_checkpoint", "latest"]
    return cmd, env


def command_line(cmd: list[str], nice: bool = True) -> str:
    """A command as a user would type it from the repo root."""
    text = shlex.join(cmd).replace(str(BIN) + "/", "").replace(str(REPO) + "/", "")
    prefix = "ACCELERATE_USE_CPU=true " if "--multi_gpu" in cmd and "--use_deepspeed" not in cmd else ""
    return f"{prefix}{'nice ' if nice else ''}{text}"


# -- model card ------------------------------------------------------------------------------------
def model_card(name: str, role: str, out_dir: Path, command: list[str], wall: float | None,
               data_commands: list[str] = (), recipe: str | None = None, installed: str = "best") -> str:
    spec = MODELS[role]
    where = "checkpoints/" + spec.checkpoint.format(name=name)
    cfg = yaml.safe_load((out_dir / "config.yaml").read_text())
    info = json.loads((out_dir / "run_info.json").read_text())
    res = json.loads((out_dir / "results.json").read_text())
    best = json.loads((out_dir / installed / "metrics.json").read_text())
    keys = spec.metric_keys
    note = spec.metrics_note if installed == "best" else spec.metrics_note.replace("best checkpoint", "last checkpoint", 1)
    groups = sorted({k.split("/")[0] for k in best if "/" in k})
    rows = [("all", best)] + [(g, {k.split("/", 1)[1]: v for k, v in best.items() if k.startswith(g + "/")}) for g in groups]
    table = ["| eval set | n | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for g, m in rows:
        table.append(f"| {g} | {int(m.get('n', 0))} | " + " | ".join(f"{m.get(k, 0):.4f}" for k in keys) + " |")
    d, t = cfg["data"], cfg["train"]
    data = [f"- train: `{d['train_file']}` ({res['train_examples']} {spec.unit} used"
            f"{', max_train_examples=' + str(d['max_train_examples']) if d['max_train_examples'] else ''}"
            f"{'; ' + spec.data_note if spec.data_note else ''})"]
    data += [f"- eval: `{f}`" + (f" (first random {d['max_eval_examples']})" if d["max_eval_examples"] else "")
             for f in d["eval_files"]]
    data += [f"- sha256 `{f}`: {h[:16]}…" for f, h in info["data_sha256"].items()]
    usage = f"; {spec.usage.format(path=where)}" if spec.usage else ""
    commands = [*data_commands, command_line(command)]
    if spec.after_install:
        commands.append(command_line(["python", *after_install_command(spec, where, "../shared/data")], nice=False))
    return "\n".join([
        f"# {where.removeprefix('checkpoints/').replace('/', ' / ')}",
        "",
        f"{spec.summary} on `{cfg['model']['name_or_path']}`, trained with effrag's `train.py` (task `{cfg['task']}`). "
        f"Load with `effrag.models.load_model(\"{where}\")`{usage}.",
        "",
        "## Data", *data, "",
        "## Training",
        f"- steps: {res['global_step']} (best at step {res['best_step']} by {res['metric_for_best']}; installed: "
        f"{'that best checkpoint' if installed == 'best' else 'the last, step ' + str(res['global_step'])}), "
        f"processes: {res['num_processes']}, mixed precision: {info['mixed_precision']}",
        f"- lr {t['lr']}, batch {t['batch_size']} x accum {t['grad_accum']} x {res['num_processes']} processes, "
        f"max_length {cfg['model']['max_length']}, epochs {t['epochs']}, seed {t['seed']}",
        f"- training loop time: {res['train_time_s']} s; whole run: {res['wall_time_s']} s"
        + (f"; this invocation {wall:.0f} s" if wall else ""),
        f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}",
        "",
        f"## Metrics ({note})", *table, "",
        "## Command", "```", *commands, "```",
        *([f"All of it (data, training, this folder): `{recipe}`"] if recipe else []),
        "Full resolved config: `effrag_config.json` (`training.config`) in this directory.", "",
    ])


def after_install_command(spec: ModelSpec, where: str, data: str) -> list[str]:
    return [a.format(path=where, data=data) for a in spec.after_install]


def install(args, role: str, out_dir: Path, cmd: list[str], wall: float | None, data_commands: list[str]) -> Path:
    """Copy the run's best checkpoint to checkpoints/ with its card, then run the model's after-install step.

    A reused run (``wall`` None: it had finished before this invocation) keeps the card already installed
    beside it, which describes the invocation that trained it."""
    from effrag.provenance import portable_text

    spec = MODELS[role]
    dest = REPO / "checkpoints" / spec.checkpoint.format(name=args.name)
    card = dest / "README.md"
    old_card = card.read_text() if wall is None and card.is_file() else None
    shutil.rmtree(dest, ignore_errors=True)
    which = args.install or spec.install or "best"
    shutil.copytree(out_dir / which, dest)
    recipe = "python " + shlex.join(["scripts/train_models.py", *sys.argv[1:]]).replace(str(REPO) + "/", "")
    # the card is committed (and may ship): paths relative to the repo or the data root, never this machine's
    card.write_text(portable_text(old_card or model_card(args.name, role, out_dir, cmd, wall, data_commands, recipe,
                                                         which)))
    if spec.after_install:
        step = [sys.executable, *after_install_command(spec, str(dest.relative_to(REPO)), str(args.data))]
        print("+", shlex.join(step), flush=True)
        subprocess.run(step, cwd=REPO, check=True)
    return dest


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
        print(f"{role}: {install(args, role, out_dir, cmd, wall, data_commands)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
