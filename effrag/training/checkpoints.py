"""Where a training run stands in its output directory: its checkpoints, and what a rerun does.

A rerun of the same command resumes from the latest complete checkpoint whose files are as saved
(an older one, with a warning, when the latest is damaged), a finished run (``results.json``) is
left alone unless its settings changed, and ``--overwrite`` starts afresh (:func:`plan_start`); a
resume cuts ``log.jsonl`` back to the checkpoint's step (:func:`prepare_output_dir`). What a
checkpoint holds, and the checks that decide whether it is resumed from, are
:mod:`.checkpoint_files`; the loop (:mod:`.loop`) restores it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from ..state_files import write_text_atomic
from .checkpoint_files import STATE_NAME, CheckpointError, check_checkpoint
from .config import Config, ConfigError

RESULTS_NAME = "results.json"  # written last: its presence marks a finished run
# what train() writes into an output directory: --overwrite deletes a directory holding only these
RUN_ENTRIES = {"config.yaml", "run_info.json", "log.jsonl", RESULTS_NAME, "eval_metrics.json", "checkpoints",
               "best", "last", "best.tmp", "last.tmp", "log.jsonl.tmp", RESULTS_NAME + ".tmp", "wandb"}
# settings that do not change what a run computes
RUN_CONTROL_KEYS = {"train.resume_from_checkpoint", "train.output_dir", "train.run_name", "train.report_to"}


class StartPlan(NamedTuple):
    """``mode`` (fresh, resume, finished, overwrite), the checkpoint resumed from and its checked trainer state."""

    mode: str
    checkpoint: Path | None = None
    state: dict | None = None


def main_print(msg: str) -> None:
    """Print on the main process only, before an Accelerator exists (RANK is set by the launchers)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("_")[1])
    except (IndexError, ValueError):
        return -1


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """``checkpoints/step_*`` folders by step, complete or not (a kill during a save leaves no trainer_state.json)."""
    return sorted((p for p in (Path(output_dir) / "checkpoints").glob("step_*") if _step_of(p) >= 0), key=_step_of)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoints whose save finished (``trainer_state.json`` is written last), by step."""
    return [c for c in checkpoint_dirs(output_dir) if (c / STATE_NAME).is_file()]


def latest_checkpoint(output_dir: Path) -> Path | None:
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def find_checkpoint(spec: str, output_dir: Path) -> Path:
    if spec == "latest":
        ckpt = latest_checkpoint(output_dir)
        if ckpt is None:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no checkpoint in {output_dir / 'checkpoints'}")
        return ckpt
    path = Path(spec)
    if not (path / STATE_NAME).is_file():
        raise FileNotFoundError(f"--resume_from_checkpoint {spec}: {path / STATE_NAME} not found")
    return path


def plan_start(cfg: Config, overwrite: bool = False) -> StartPlan:
    """What a run into ``train.output_dir`` does, decided before anything is written.

    ``overwrite``: clear the directory, start at step 0; ``resume``: ``train.resume_from_checkpoint`` if
    given (refused with one line when :func:`check_checkpoint` fails), else the latest complete checkpoint
    that passes it (damaged later ones are skipped with a warning; none passing is the newest's error);
    ``finished``: ``results.json`` is there (and no explicit resume): nothing to train, unless the settings
    differ from the finished run's (a :class:`ConfigError` listing them); ``fresh``: no checkpoint, step 0.
    """
    tc = cfg.train
    out_dir = Path(tc.output_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"train.output_dir: {out_dir} is a file, not a directory")
    if overwrite:
        if tc.resume_from_checkpoint:
            raise ConfigError("--overwrite starts afresh and --resume_from_checkpoint resumes: give one of them")
        others = sorted(p.name for p in out_dir.iterdir() if p.name not in RUN_ENTRIES) if out_dir.is_dir() else []
        if others:
            raise ConfigError(f"--overwrite: {out_dir} holds files a training run does not write ({', '.join(others[:5])}"
                              f"{', ...' if len(others) > 5 else ''}); not deleting it: choose another train.output_dir")
        return StartPlan("overwrite")
    if tc.resume_from_checkpoint:
        try:
            ckpt = find_checkpoint(tc.resume_from_checkpoint, out_dir)
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
        return StartPlan("resume", ckpt, check_checkpoint(ckpt))
    if (out_dir / RESULTS_NAME).is_file():
        changes = config_changes(out_dir, cfg)
        if changes is None:
            raise ConfigError(f"{out_dir / 'config.yaml'}: a finished run whose settings file is missing or unreadable: "
                              "cannot tell whether it was trained with these settings; --overwrite retrains it, or "
                              "choose another train.output_dir")
        if changes:
            raise ConfigError(f"{out_dir} is a finished run with other settings ({'; '.join(changes)}): nothing "
                              "trained; --overwrite retrains it with these settings, or choose another train.output_dir")
        return StartPlan("finished")
    refused: list[CheckpointError] = []
    for ckpt in reversed(complete_checkpoints(out_dir)):
        try:
            state = check_checkpoint(ckpt)
        except CheckpointError as e:
            refused.append(e)
            continue
        for e in refused:
            main_print(f"warning: skipping a damaged checkpoint: {e}")
        return StartPlan("resume", ckpt, state)
    if refused:
        raise refused[0]
    return StartPlan("fresh")


def finished_results(out_dir: Path) -> dict:
    """A finished run's ``results.json`` (``plan_start``'s ``finished``), said in one line: a rerun trains nothing."""
    try:
        results = json.loads((out_dir / RESULTS_NAME).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{out_dir / RESULTS_NAME}: unreadable ({' '.join(str(e).split())}); "
                          "--overwrite trains the run again") from None
    main_print(f"{out_dir} is a finished run (step {results.get('global_step')} of {results.get('total_steps')}, "
               f"{RESULTS_NAME} is there): nothing to train; --overwrite trains it again from step 0")
    return results


def config_changes(run_dir: Path, cfg: Config) -> list[str] | None:
    """Settings that differ between ``run_dir/config.yaml`` (a checkpoint's or a run's) and ``cfg``
    (run-control keys aside); None when that file is missing or unreadable (nothing to compare: never "no
    changes")."""
    import yaml

    try:
        old = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(old, dict):
        return None
    changes = []
    for section, values in cfg.to_dict().items():
        if not isinstance(values, dict):
            if old.get(section) != values:
                changes.append(f"{section}: {old.get(section)!r} -> {values!r}")
            continue
        was_section = old.get(section) if isinstance(old.get(section), dict) else {}
        for k, v in values.items():
            was = was_section.get(k, v)
            if f"{section}.{k}" not in RUN_CONTROL_KEYS and was != v:
                changes.append(f"{section}.{k}: {was!r} -> {v!r}")
    return changes


def prepare_output_dir(out_dir: Path, mode: str, step: int) -> None:
    """Main process: clear (overwrite), or cut the log and drop what a resumed run will write again."""
    if mode == "overwrite":
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS_NAME).unlink(missing_ok=True)  # written again at the end: a kill before it = unfinished
    for stale in checkpoint_dirs(out_dir):  # a later history than the one resumed (or partial saves)
        if _step_of(stale) > step:
            shutil.rmtree(stale, ignore_errors=True)
    log_file = out_dir / "log.jsonl"
    if log_file.is_file():
        kept = []
        for line in log_file.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                break  # a line cut by the kill: nothing after it is kept
        write_text_atomic(log_file, "".join(kept))
