"""``effrag``'s subcommands from other packages: the ``effrag.commands`` entry point group (issue #42).

The training-data commands (``synthesize``, ``irrr-data``, ``filter-data``, ``ranker-data``) live in
``data_synthesis``, which ``effrag`` never imports: ``pyproject.toml`` registers them in the group and
``effrag.cli`` discovers it with ``importlib.metadata``. These tests write real distribution metadata
(a ``*.dist-info`` folder with ``entry_points.txt``) on ``sys.path``, as an install does.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import write_command_entry_points

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_registers_every_training_data_command_and_each_loads(tmp_path, monkeypatch):
    from importlib.metadata import entry_points

    from effrag.cli import COMMAND_GROUP, DATA_COMMANDS

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][COMMAND_GROUP]
    assert sorted(declared) == sorted(DATA_COMMANDS)
    assert all(v.startswith("data_synthesis.cli:add_") for v in declared.values())
    info = write_command_entry_points(tmp_path, name="effrag_probe_dist")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {ep.name: ep for ep in entry_points(group=COMMAND_GROUP) if ep.dist.name == "effrag_probe_dist"}
    assert sorted(found) == sorted(DATA_COMMANDS) and info.is_dir()
    from data_synthesis import cli

    assert found["synthesize"].load() is cli.add_synthesize_parser


def test_a_command_of_another_installed_package_runs_through_the_group(tmp_path, monkeypatch, capsys):
    """A plugin package effrag has never heard of: its module and its dist-info, nothing else."""
    from effrag.cli import main

    (tmp_path / "effrag_probe_plugin.py").write_text(
        "def add_probe_parser(sub):\n"
        "    p = sub.add_parser('probe', help='a plugin command')\n"
        "    p.add_argument('--word', required=True)\n"
        "    p.set_defaults(func=lambda args: print('probe says', args.word))\n")
    info = tmp_path / "effrag_probe_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: effrag_probe_plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[effrag.commands]\nprobe = effrag_probe_plugin:add_probe_parser\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["probe", "--word", "hello"]) == 0
    assert capsys.readouterr().out.strip() == "probe says hello"
    with pytest.raises(SystemExit) as stop:  # the plugin's parser, effrag's one-line usage errors
        main(["probe"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("effrag probe: error: the following arguments")


def test_without_the_entry_points_a_training_data_command_is_one_line_saying_how_to_get_it(tmp_path):
    """No site-packages (``python -S``) and only the effrag package on the path: no installed metadata at all.

    The checkout's root is not on the path, because an editable install leaves ``effrag.egg-info`` there, and
    its entry points would register the data_synthesis commands."""
    alone = tmp_path / "path"
    alone.mkdir()
    (alone / "effrag").symlink_to(ROOT / "effrag", target_is_directory=True)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(alone), "HF_HUB_OFFLINE": "1"}
    code = "from effrag.cli import main; raise SystemExit(main(['synthesize', '--inputs', 'x', '--output', 'y']))"
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    assert err[0].startswith("effrag: error: `effrag synthesize` is a command of the project's data_synthesis")
    assert err[0].endswith("install effrag with its data_synthesis package: pip install -e .")


def test_python_m_data_synthesis_cli_brings_its_own_commands_without_metadata(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-S", "-m", "data_synthesis.cli", "irrr-data", "--help"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--augment-p" in out.stdout, out.stderr
