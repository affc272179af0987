"""Training checkpoints that must not be trusted (issue #40 §1-3, §8, §10): planted pickles, changed bytes,
truncated state, incomplete folders, bad data bytes, a finished run rerun with other settings.

Each fault is made for real in a checkpoint written by a real (tiny) training run that was killed in the
middle of a step; the rerun goes through ``train.py``'s ``main`` and must end in one line naming the file.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from helpers import Killed, kill_during_step, read_log, reset_accelerate, tiny_overrides, weights

from effrag.training import cli as train_cli
from effrag.training import load_config, train

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py



class _Payload:
    """Unpickling it opens ``marker`` for writing, i.e. creates the file: the code a planted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _killed_run(tiny, out: Path, monkeypatch, kill_at: int, **kw) -> Path:
    """A filter run killed in the first backward pass of step ``kill_at``: checkpoints, no results.json."""
    cfg = load_config(None, tiny_overrides(tiny, "filter", out, **kw))
    with monkeypatch.context() as m:
        kill_during_step(m, kill_at, kw.get("train__grad_accum", 1))
        with pytest.raises(Killed):
            train(cfg)
    reset_accelerate()
    assert not (out / "results.json").exists()
    cfg_file = out.parent / f"{out.name}.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_overrides(tiny, "filter", out, **kw)))
    return cfg_file


def _rerun(cfg_file: Path, capsys, *extra: str) -> tuple[int, list[str], str]:
    """``train.py --config FILE ...`` in process: (exit status, stderr lines, stdout)."""
    capsys.readouterr()
    rc = train_cli.main(["--config", str(cfg_file), *extra])
    captured = capsys.readouterr()
    return rc, captured.err.strip().splitlines(), captured.out


def _overwrite(path: Path, n: int = 4096) -> None:
    """``n`` bytes of 0xff in the middle of ``path`` (size unchanged)."""
    data = bytearray(path.read_bytes())
    start = max(0, len(data) // 2 - n // 2)
    data[start:start + n] = b"\xff" * min(n, len(data) - start)
    path.write_bytes(bytes(data))


KW = dict(train__max_steps=12, train__save_every=4, train__save_total_limit=1)


# -- §1: a planted pickle never runs -------------------------------------------------------------
@pytest.mark.parametrize("case", ["automatic", "explicit", "old_format"])
def test_planted_pickle_in_a_checkpoint_is_never_unpickled(tiny, tmp_path, monkeypatch, capsys, case):
    proof = tmp_path / "proof"
    payload = pickle.dumps(_Payload(proof))
    pickle.loads(payload)  # the payload is live: unpickling it does run code
    assert proof.exists()

    out = tmp_path / "run"
    cfg_file = _killed_run(tiny, out, monkeypatch, kill_at=6, **KW)
    ckpt = out / "checkpoints" / "step_0000004"
    marker = tmp_path / "marker"
    planted = ckpt / "custom_checkpoint_0.pkl"  # the name accelerate's load_state would torch.load
    planted.write_bytes(pickle.dumps(_Payload(marker)))
    if case == "old_format":  # a checkpoint as accelerate's save_state wrote it: no file records
        state = json.loads((ckpt / "trainer_state.json").read_text())
        del state["files"]
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    extra = ["--resume_from_checkpoint", str(ckpt)] if case == "explicit" else []
    rc, err, _ = _rerun(cfg_file, capsys, *extra)
    assert not marker.exists()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"train.py: error: {planted}: "), err
    assert "--overwrite" in err[0]
    assert (out / "log.jsonl").is_file() and not (out / "results.json").exists()  # nothing was changed


def test_checkpoint_folder_holds_no_pickle(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _killed_run(tiny, out, monkeypatch, kill_at=6, **KW)
    ckpt = out / "checkpoints" / "step_0000004"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["config.yaml", "model.safetensors", "optimizer.safetensors", "rng_state_0.safetensors",
                     "scheduler.json", "trainer_state.json"]
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert sorted(state["files"]) == [n for n in names if n != "trainer_state.json"]
    for n in names:  # none starts with a pickle opcode (b"\x80" protocol marker) or is a zip (torch.save)
        assert (ckpt / n).read_bytes()[:2] not in (b"\x80\x02", b"\x80\x04", b"\x80\x05", b"PK")


# -- §2, §3: changed bytes, truncated state ----------------------------------------------------------
@pytest.mark.parametrize("file, damage, message", [
    ("model.safetensors", "flip", "sha256 mismatch"),
    ("optimizer.safetensors", "flip", "sha256 mismatch"),
    ("optimizer.safetensors", "truncate", "size is"),
    ("trainer_state.json", "truncate", "unreadable"),
])
def test_damaged_only_checkpoint_is_refused_with_one_line(tiny, tmp_path, monkeypatch, capsys, file, damage, message):
    out = tmp_path / "run"
    cfg_file = _killed_run(tiny, out, monkeypatch, kill_at=6, **KW)
    target = out / "checkpoints" / "step_0000004" / file
    if damage == "flip":
        _overwrite(target)
    else:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    rc, err, _ = _rerun(cfg_file, capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: {target}: ") and message in err[0] and "--overwrite" in err[0]
    assert not (out / "results.json").exists()


def test_damaged_latest_checkpoint_falls_back_to_the_previous_and_ends_bit_identical(tiny, tmp_path, monkeypatch,
                                                                                     capsys):
    kw = dict(train__max_steps=16, train__save_every=4, train__save_total_limit=3, model__hidden_dropout=0.1)
    a = tmp_path / "a"
    res_a = train(load_config(None, tiny_overrides(tiny, "filter", a, **kw)))
    reset_accelerate()
    b = tmp_path / "b"
    cfg_file = _killed_run(tiny, b, monkeypatch, kill_at=14, **kw)
    damaged = b / "checkpoints" / "step_0000012" / "model.safetensors"
    _overwrite(damaged)
    rc, err, said = _rerun(cfg_file, capsys)
    assert rc == 0, err
    warning = [line for line in said.splitlines() if line.startswith("warning: skipping a damaged checkpoint")]
    assert len(warning) == 1 and str(damaged) in warning[0] and "sha256 mismatch" in warning[0]
    assert f"resuming from checkpoint {b / 'checkpoints' / 'step_0000008'} at step 8 of 16" in said
    res_b = json.loads((b / "results.json").read_text())
    assert res_b["param_checksums"] == res_a["param_checksums"] and read_log(b) == read_log(a)
    wa, wb = weights(a / "last"), weights(b / "last")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.isnan(torch.cat([w.flatten() for w in wb.values()])).any()


def test_incomplete_checkpoint_folder_is_skipped_and_removed(tiny, tmp_path, monkeypatch, capsys):
    """A kill during a save leaves a step folder without trainer_state.json (written last): it is not resumed from."""
    out = tmp_path / "run"
    cfg_file = _killed_run(tiny, out, monkeypatch, kill_at=6, **KW)
    done = out / "checkpoints" / "step_0000004"
    partial = out / "checkpoints" / "step_0000005"
    partial.mkdir()
    weights = (done / "model.safetensors").read_bytes()
    (partial / "model.safetensors").write_bytes(weights[: len(weights) // 3])  # cut mid-write
    rc, err, said = _rerun(cfg_file, capsys)
    assert rc == 0, err
    assert f"resuming from checkpoint {done} at step 4 of 12" in said
    assert not partial.exists()
    assert json.loads((out / "results.json").read_text())["global_step"] == 12


# -- §8: data files checked before anything loads ---------------------------------------------------------
def test_bad_data_files_are_one_line_before_the_model_loads(tiny, tmp_path, monkeypatch, capsys):
    from effrag.training import loop

    def no_accelerator(cfg):
        raise AssertionError("the error should come before the Accelerator and the model")

    monkeypatch.setattr(loop, "make_accelerator", no_accelerator)
    lines = Path(tiny["filter_train"]).read_bytes().splitlines(keepends=True)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b"".join(lines[:2]) + lines[2].replace(b'"', b'"\xe9', 1) + b"".join(lines[3:]))
    out = tmp_path / "out"
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_overrides(tiny, "filter", out)))
    col = lines[2].index(b'"') + 2
    offset = len(b"".join(lines[:2])) + col - 1
    for data, expected in [(bad, f"{bad}:3: not UTF-8 (byte 0xe9 at column {col}, byte offset {offset})"),
                           (tmp_path / "missing.jsonl", f"data.train_file: file not found: {tmp_path / 'missing.jsonl'}")]:
        rc, err, _ = _rerun(cfg_file, capsys, "--data.train_file", str(data))
        assert rc == 2 and len(err) == 1 and expected in err[0], err
        assert not out.exists()  # no empty output folder left behind


# -- §10: a finished run rerun with other settings ------------------------------------------------------------
def test_rerun_of_a_finished_run_with_other_settings_names_them(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_overrides(tiny, "filter", out, train__max_steps=2)))
    assert _rerun(cfg_file, capsys)[0] == 0
    reset_accelerate()
    results = (out / "results.json").read_text()
    rc, err, _ = _rerun(cfg_file, capsys, "--train.lr", "1e-3", "--train.seed", "7")
    assert rc == 2 and len(err) == 1, err
    assert f"{out} is a finished run with other settings" in err[0]
    assert "train.lr: 0.002 -> 0.001" in err[0] and "train.seed: 42 -> 7" in err[0] and "--overwrite" in err[0]
    assert (out / "results.json").read_text() == results
    rc, _, said = _rerun(cfg_file, capsys)  # the same settings: the finished run, exit 0
    assert rc == 0 and "is a finished run (step 2 of 2" in said
    # issue #46, 10: the finished run's config.yaml missing or unreadable is not "no changes"
    for damage in ("missing", "unreadable"):
        if damage == "missing":
            (out / "config.yaml").unlink()
        else:
            (out / "config.yaml").write_bytes(b"train: [unclosed\n\xff")
        rc, err, _ = _rerun(cfg_file, capsys, "--train.lr", "1e-3")
        assert rc == 2 and len(err) == 1 and f"{out / 'config.yaml'}: a finished run whose settings file is missing " \
            "or unreadable" in err[0], err
        assert (out / "results.json").read_text() == results


# -- issue #46, 9: records rewritten with the damage, a hand-edited step ------------------------------------------
@pytest.mark.parametrize("fault", ["nan weights, records rewritten", "global_step edited"])
def test_resume_refuses_nan_weights_and_a_step_outside_the_run(tiny, tmp_path, monkeypatch, capsys, fault):
    """The records can be rewritten along with the damage (a copy tool, a hand edit): the NaN/Inf check that
    from_pretrained applies runs on resume too, and a global_step outside the run no longer "finishes" at once."""
    from effrag.integrity import file_record

    out = tmp_path / "run"
    cfg_file = _killed_run(tiny, out, monkeypatch, kill_at=6, **KW)
    ckpt = out / "checkpoints" / "step_0000004"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    if fault.startswith("nan"):
        _overwrite(ckpt / "model.safetensors")  # 0xff bytes: NaN as float32
        state["files"]["model.safetensors"] = file_record(ckpt / "model.safetensors")
        target, message = ckpt / "model.safetensors", "holds NaN/Inf values"
    else:
        state["global_step"] = 1_000_000_000
        target, message = ckpt / "trainer_state.json", "global_step 1000000000 is outside this run's 0..12 steps"
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    rc, err, _ = _rerun(cfg_file, capsys)
    err = [line for line in err if not line.startswith("Loading weights")]  # transformers' bar, before the check
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: {target}: ") and message in err[0] and "--overwrite" in err[0]
    assert not (out / "results.json").exists()
