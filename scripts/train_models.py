"""Train the EfficientRAG Labeler and Filter and install them as checkpoints/efficientrag-<name>/{labeler,filter}.

    nice python scripts/train_models.py --name all                       # CPU configs, 1 process
    nice python scripts/train_models.py --name all --processes 2         # 2 gloo processes on CPU
    python scripts/train_models.py --name all --paper --launch-args "--multi_gpu --num_processes 4"
    python scripts/train_models.py --name all -- --data.max_train_examples 3000   # overrides for both
    python scripts/train_models.py --name hotpotqa --synth runs/synth/train_hotpotqa  # per-dataset data

Each model trains with ``accelerate launch train.py`` into runs/train/<name>/<role>; a run that
stopped resumes from its latest checkpoint, a finished run is reused (``--force`` retrains).
The best checkpoint is copied to checkpoints/efficientrag-<name>/<role> with a model card
(README.md: data, config, metrics, command) written from the run's own files.
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

import yaml

REPO = Path(__file__).resolve().parents[1]
ROLES = ("labeler", "filter")


def launch_command(args, role: str, out_dir: Path, extra: list[str]) -> tuple[list[str], dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launcher = [str(Path(sys.executable).parent / "accelerate"), "launch"]
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
    config = REPO / "configs" / (f"{role}_paper.yaml" if args.paper else f"{role}.yaml")
    cmd = [*launcher, str(REPO / "train.py"), "--config", str(config), "--output_dir", str(out_dir), *extra]
    if (out_dir / "checkpoints").is_dir() and any((out_dir / "checkpoints").glob("step_*/trainer_state.json")):
        cmd += ["--resume_from_checkpoint", "latest"]
    return cmd, env


def role_overrides(args, role: str, extra: list[str]) -> list[str]:
    """train.py overrides for one role: its synthesized file, the shared overrides, then the Labeler-only ones."""
    out = (["--data.train_file", str(Path(args.synth) / f"{role}.jsonl")] if args.synth else []) + list(extra)
    if role == "labeler":
        out += shlex.split(args.labeler_overrides)
    return out


def command_line(cmd: list[str]) -> str:
    """The launch command as a user would type it from the repo root."""
    text = shlex.join(cmd).replace(str(REPO) + "/", "").replace(str(Path(sys.executable).parent) + "/", "")
    prefix = "ACCELERATE_USE_CPU=true " if "--multi_gpu" in cmd and "--use_deepspeed" not in cmd else ""
    return f"{prefix}nice {text}"


def model_card(name: str, role: str, out_dir: Path, command: list[str], wall: float | None) -> str:
    cfg = yaml.safe_load((out_dir / "config.yaml").read_text())
    info = json.loads((out_dir / "run_info.json").read_text())
    res = json.loads((out_dir / "results.json").read_text())
    best = json.loads((out_dir / "best" / "metrics.json").read_text())
    keys = ["token_precision", "token_recall", "token_f1", "token_accuracy"] + \
        (["tag_accuracy", "tag_continue_f1"] if role == "labeler" else ["exact_match"])
    groups = sorted({k.split("/")[0] for k in best if "/" in k}) or []
    rows = [("all", best)] + [(g, {k.split("/", 1)[1]: v for k, v in best.items() if k.startswith(g + "/")}) for g in groups]
    table = ["| eval set | n | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for g, m in rows:
        table.append(f"| {g} | {int(m.get('n', 0))} | " + " | ".join(f"{m.get(k, 0):.4f}" for k in keys) + " |")
    data = [f"- train: `{cfg['data']['train_file']}` ({res['train_examples']} records used"
            f"{', max_train_examples=' + str(cfg['data']['max_train_examples']) if cfg['data']['max_train_examples'] else ''})"]
    data += [f"- eval: `{f}`" + (f" (first random {cfg['data']['max_eval_examples']})" if cfg['data']['max_eval_examples'] else "")
             for f in cfg["data"]["eval_files"]]
    data += [f"- sha256 `{f}`: {h[:16]}…" for f, h in info["data_sha256"].items()]
    return "\n".join([
        f"# efficientrag-{name} / {role}",
        "",
        f"EfficientRAG {role.capitalize()} ({'token head + <Continue>/<Terminate> chunk head' if role == 'labeler' else 'token head'})"
        f" on `{cfg['model']['name_or_path']}`, trained with effrag's `train.py`. Load with "
        f"`effrag.models.load_model(\"checkpoints/efficientrag-{name}/{role}\")`.",
        "",
        "## Data", *data, "",
        "## Training",
        f"- steps: {res['global_step']} (best at step {res['best_step']} by {res['metric_for_best']}), "
        f"processes: {res['num_processes']}, mixed precision: {info['mixed_precision']}",
        f"- lr {cfg['train']['lr']}, batch {cfg['train']['batch_size']} x accum {cfg['train']['grad_accum']} x "
        f"{res['num_processes']} processes, max_length {cfg['model']['max_length']}, seed {cfg['train']['seed']}",
        f"- training loop time: {res['train_time_s']} s; whole run: {res['wall_time_s']} s"
        + (f"; this invocation {wall:.0f} s" if wall else ""),
        f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}",
        "",
        "## Metrics (best checkpoint; word level, positive class = keep)", *table, "",
        "## Command", "```", command_line(command), "```",
        "Full resolved config: `effrag_config.json` (`training.config`) in this directory.", "",
    ])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="all", help="checkpoint name: checkpoints/efficientrag-<name>")
    p.add_argument("--roles", default="labeler,filter")
    p.add_argument("--processes", type=int, default=1, help="CPU processes (gloo DDP)")
    p.add_argument("--launch-args", default="", help="raw accelerate launch arguments (GPU/DeepSpeed setups)")
    p.add_argument("--paper", action="store_true", help="use configs/*_paper.yaml (DeBERTa-v3-large; GPUs)")
    p.add_argument("--force", action="store_true", help="retrain even if the run finished")
    p.add_argument("--synth", metavar="DIR", help="synthesis output dir: trains on DIR/labeler.jsonl and DIR/filter.jsonl")
    p.add_argument("--labeler-overrides", default="", metavar="ARGS",
                   help="overrides for the Labeler only, e.g. '--model.name_or_path smollm2 --train.lr 5e-5'")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="after --: overrides passed to both trainings")
    args = p.parse_args()
    extra = [a for a in args.overrides if a != "--"]
    for role in args.roles.split(","):
        if role not in ROLES:
            p.error(f"unknown role {role!r}; choose from {ROLES}")
        out_dir = REPO / "runs" / "train" / args.name / role
        if args.force:
            shutil.rmtree(out_dir, ignore_errors=True)
        role_extra = role_overrides(args, role, extra)
        cmd, env = launch_command(args, role, out_dir, role_extra)
        wall = None
        if not (out_dir / "results.json").is_file():
            print("+", shlex.join(cmd), flush=True)
            t0 = time.time()
            subprocess.run(cmd, cwd=REPO, env=env, check=True)
            wall = time.time() - t0
        dest = REPO / "checkpoints" / f"efficientrag-{args.name}" / role
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(out_dir / "best", dest)
        (dest / "README.md").write_text(model_card(args.name, role, out_dir, cmd, wall))
        print(f"{role}: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
