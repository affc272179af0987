"""Rerunning ``train.py`` into the same output directory (issue #14 §4.3): a killed run resumes and ends bit
identical to an unbroken one (in process and with 2 gloo processes), a finished run trains nothing, ``--overwrite``
starts afresh, and errors are one line before any heavy work. Checkpoints that must not be trusted:
test_training_checkpoints.py. Tiny encoders and records: tests/helpers.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, Killed, kill_during_step, launch_training, read_log, reset_accelerate, tiny_overrides, weights

from effrag.training import ConfigError, load_config, train

ACCELERATE = str(Path(sys.executable).parent / "accelerate")
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


# -- rerunning into the same output directory: resume, finished, --overwrite (issue #14 §4.3) ------
@pytest.mark.parametrize("kw, kill_at, resumed_from", [
    # grouped batches, accumulation 2 (5 steps an epoch), checkpoints mid-epoch at 6 and 12, a log line
    # every 4 steps (the loss average spans the checkpoint), eval every 5, cosine schedule
    (dict(train__group_by_length=True, train__grad_accum=2, train__save_every=6, train__log_every=4,
          train__eval_every=5, train__scheduler="cosine"), 18, 12),
    # accelerate's seedable shuffle, a checkpoint at an epoch's end (step 10) after its end-of-epoch eval
    (dict(train__save_every=10, train__log_every=3, train__eval_every=0), 13, 10),
])
def test_rerun_after_a_kill_resumes_and_ends_bit_identical_to_an_unbroken_run(tiny, tmp_path, monkeypatch, capsys,
                                                                               kw, kill_at, resumed_from):
    kw = dict(train__max_steps=20, train__save_total_limit=5, model__hidden_dropout=0.1, model__head_dropout=0.1, **kw)
    a, b = tmp_path / "a", tmp_path / "b"
    res_a = train(load_config(None, tiny_overrides(tiny, "filter", a, **kw)))
    reset_accelerate()
    with monkeypatch.context() as m:
        kill_during_step(m, kill_at, kw.get("train__grad_accum", 1))
        with pytest.raises(Killed):
            train(load_config(None, tiny_overrides(tiny, "filter", b, **kw)))
    assert max(x["step"] for x in read_log(b)) > resumed_from and not (b / "results.json").exists()  # to be cut
    reset_accelerate()
    capsys.readouterr()
    res_b = train(load_config(None, tiny_overrides(tiny, "filter", b, **kw)))  # the same command again
    said = capsys.readouterr().out
    assert f"resuming from checkpoint {b / 'checkpoints' / f'step_{resumed_from:07d}'} at step {resumed_from} of 20" in said
    assert res_b["examples_seen_per_process"] == (20 - resumed_from) * 4 * kw.get("train__grad_accum", 1)
    log_a, log_b = read_log(a), read_log(b)
    assert log_b == log_a  # losses, lrs, eval metrics: equal, and no step twice
    train_steps = [x["step"] for x in log_b if "train/loss" in x]
    assert len(train_steps) == len(set(train_steps))
    for sub in ("last", "best"):
        wa, wb = weights(a / sub), weights(b / sub)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), sub
    for key in ("global_step", "lr", "best_metric", "best_step", "eval", "param_checksums"):
        assert res_b[key] == res_a[key], key
    info = json.loads((b / "run_info.json").read_text())
    assert [r["step"] for r in info["resumed"]] == [resumed_from]


def test_two_fresh_runs_are_bit_identical(tiny, tmp_path):
    kw = dict(train__max_steps=6, model__hidden_dropout=0.1, train__eval_every=3)
    res = []
    for name in ("a", "b"):
        reset_accelerate()
        res.append(train(load_config(None, tiny_overrides(tiny, "filter", tmp_path / name, **kw))))
    wa, wb = weights(tmp_path / "a" / "last"), weights(tmp_path / "b" / "last")
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and read_log(tmp_path / "a") == read_log(tmp_path / "b")
    assert res[0]["eval"] == res[1]["eval"]


def test_rerun_of_a_finished_run_trains_nothing_and_overwrite_starts_afresh(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(tiny, "filter", out, train__max_steps=4, train__save_every=2))
    first = train(cfg)
    log_before, mtime = (out / "log.jsonl").read_text(), (out / "last" / "heads.safetensors").stat().st_mtime_ns
    reset_accelerate()
    capsys.readouterr()
    assert train(cfg) == first
    assert "is a finished run (step 4 of 4" in capsys.readouterr().out
    assert (out / "log.jsonl").read_text() == log_before
    assert (out / "last" / "heads.safetensors").stat().st_mtime_ns == mtime
    (out / "log.jsonl").write_text(log_before + log_before)  # would show as duplicates if kept
    reset_accelerate()
    again = train(cfg, overwrite=True)
    assert "--overwrite: cleared" in capsys.readouterr().out
    assert again["global_step"] == 4 and again["examples_seen_per_process"] == 16
    assert (out / "log.jsonl").read_text() == log_before  # seeded: the same run again, once
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"--overwrite: .* holds files a training run does not write \(notes.txt\)"):
        train(cfg, overwrite=True)
    with pytest.raises(ConfigError, match="give one of them"):
        train(load_config(None, tiny_overrides(tiny, "filter", tmp_path / "x", train__resume_from_checkpoint="latest")),
              overwrite=True)


def test_rerun_without_a_checkpoint_restarts_the_log(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(tiny, "filter", out, train__max_steps=5, train__save_every=4))
    with monkeypatch.context() as m:
        kill_during_step(m, 3, 1)  # before the first checkpoint
        with pytest.raises(Killed):
            train(cfg)
    assert [x["step"] for x in read_log(out)] == [1, 2]
    reset_accelerate()
    res = train(cfg)
    assert res["global_step"] == 5 and "resuming" not in capsys.readouterr().out
    assert [x["step"] for x in read_log(out) if "train/loss" in x] == [1, 2, 3, 4, 5]


def test_explicit_resume_from_an_older_checkpoint_drops_the_later_history(tiny, tmp_path):
    out = tmp_path / "run"
    kw = dict(train__max_steps=9, train__save_every=3, train__save_total_limit=5)
    res = train(load_config(None, tiny_overrides(tiny, "filter", out, **kw)))
    ckpt3 = out / "checkpoints" / "step_0000003"
    reset_accelerate()
    again = train(load_config(None, tiny_overrides(tiny, "filter", out, train__resume_from_checkpoint=str(ckpt3), **kw)))
    assert again["examples_seen_per_process"] == 6 * 4 and again["param_checksums"] == res["param_checksums"]
    assert [x["step"] for x in read_log(out) if "train/loss" in x] == list(range(1, 10))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000003", "step_0000006"]


@pytest.mark.parametrize("override, field", [
    (["--task", "filtr"], "task: unknown 'filtr'"),
    (["--train.batch_size", "-4"], "train.batch_size must be > 0, got -4"),
    (["--train.lr", "-1e-4"], "train.lr must be > 0, got -0.0001"),
    (["--train.scheduler", "linearr"], "train.scheduler must be one of linear, cosine"),
    (["--model.name_or_path", "/no/such/encoder"], "model.name_or_path: '/no/such/encoder' is neither"),
    (["--overwrite", "--resume_from_checkpoint", "latest"], "give one of them"),
])
def test_cli_errors_are_one_line_naming_the_field_before_any_heavy_work(tiny, tmp_path, capsys, monkeypatch,
                                                                       override, field):
    from effrag.training import cli as train_cli
    from effrag.training import loop

    def no_accelerator(cfg):
        raise AssertionError("the error should come before the Accelerator and the model")

    monkeypatch.setattr(loop, "make_accelerator", no_accelerator)
    cfg_file = tmp_path / "tiny.yaml"
    import yaml

    cfg_file.write_text(yaml.safe_dump(tiny_overrides(tiny, "filter", tmp_path / "out")))
    assert train_cli.main(["--config", str(cfg_file), *override]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: ") and field in lines[0], captured.err
    assert not (tmp_path / "out").exists()


def test_config_error_under_accelerate_launch_is_one_line_with_q(tmp_path):
    """`accelerate launch -q`: train.py's line is all; without -q accelerate adds its CalledProcessError traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env.pop("ACCELERATE_USE_CPU", None)
    proc = subprocess.run([ACCELERATE, "launch", "-q", "--num_processes", "1", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", str(REPO / "train.py"),
                           "--config", "filter", "--train.batch_size", "-4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "train.py: error: filter: train.batch_size must be > 0, got -4", proc.stderr[-2000:]


@pytest.mark.slow
def test_two_cpu_processes_rerun_resumes_bit_identical(tiny, tmp_path):
    """2 gloo processes: per-process RNG and loss sums restored; the rerun of a run cut after step 5 equals it."""
    kw = dict(train__save_every=2, train__log_every=4, train__save_total_limit=3, model__hidden_dropout=0.1)
    res_a = launch_training(tiny, tmp_path / "a", ["--multi_gpu"], use_cpu=True, **kw)
    b = tmp_path / "b"
    shutil.copytree(tmp_path / "a", b)  # as if killed during step 6: its results and last model never written
    shutil.rmtree(b / "last")
    (b / "results.json").unlink()
    res_b = launch_training(tiny, b, ["--multi_gpu"], use_cpu=True, **kw)
    # 5 batches per process and epoch, accumulation 2: steps 5 and 6 are batches 3-4 and 5 of epoch 1
    assert res_b["examples_seen_per_process"] == 3 * 4
    assert res_b["param_checksums"] == res_a["param_checksums"] and res_b["ranks_in_sync"] is True
    assert read_log(b) == read_log(tmp_path / "a")
    wa, wb = weights(tmp_path / "a" / "last"), weights(b / "last")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
