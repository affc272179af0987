"""``effrag eval --config FILE`` (effrag.run_config): a run's config.json replays it, flags override the file, bad keys
and paths are one-line errors naming the file, and the shipped example config runs."""
from __future__ import annotations

import json

import pytest
from helpers import run_cli as run

from effrag import configs
from effrag.cli import main
from effrag.data import sample_path
from effrag.run_config import _recorded_k

HOTPOT_TRAIN, HOTPOT_DEV = sample_path("hotpotqa", "train"), sample_path("hotpotqa", "dev")


def predictions(folder) -> list[dict]:
    """The rows of a run's predictions.jsonl without their timings."""
    rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("latency_s", "timing")} for r in rows]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A finished tiny run: Direct-R over BM25 on the bundled HotpotQA sample, through the CLI."""
    d = tmp_path_factory.mktemp("evalcfg")
    code = main(["eval", "--method", "direct-r", "--questions", str(HOTPOT_DEV), "--corpus-from", str(HOTPOT_TRAIN),
                 "--retriever", "bm25", "--k", "4", "--limit", "3", "--cache-dir", str(d / "cache"),
                 "--output", str(d / "run")])
    assert code == 0
    return d


def test_a_runs_config_json_replays_it(written, tmp_path, capsys):
    code, out, err = run(["eval", "--config", written / "run" / "config.json", "--cache-dir", written / "cache",
                          "--output", tmp_path / "again"], capsys)
    assert code == 0, err
    assert "warning" not in err
    again = predictions(tmp_path / "again")
    assert len(again) == 3 and all(len(r["retrieved"]) == 4 for r in again)
    assert again == predictions(written / "run")
    first, second = (json.loads((f / "config.json").read_text()) for f in (written / "run", tmp_path / "again"))
    assert second["run"] == first["run"] and second["seed"] == first["seed"]
    assert "| direct-r | hotpotqa | bm25 | 4 | 3 |" in out


def test_command_line_flags_override_the_file(written, tmp_path, capsys):
    code, _, err = run(["eval", "--config", written / "run" / "config.json", "--k", 2, "--limit", 2,
                        "--cache-dir", written / "cache", "--output", tmp_path / "k2"], capsys)
    assert code == 0, err
    rows = predictions(tmp_path / "k2")
    assert len(rows) == 2 and all(len(r["retrieved"]) == 2 for r in rows)
    assert [r["retrieved"] for r in rows] == [r["retrieved"][:2] for r in predictions(written / "run")[:2]]
    run_cfg = json.loads((tmp_path / "k2" / "config.json").read_text())["run"]
    assert run_cfg["k"] == [2] and run_cfg["limit"] == 2 and run_cfg["retriever"] == "bm25"


def test_a_yaml_config_with_output_and_portable_paths(written, tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("method: direct-r\nquestions: <sample>/hotpotqa/dev.jsonl\ncorpus-from: [<sample>/hotpotqa/train.jsonl]\n"
                   f"retriever: bm25\nk: 4\nlimit: 3\ncache_dir: {written / 'cache'}\noutput: {tmp_path / 'out'}\n")
    code, _, err = run(["eval", "--config", cfg], capsys)
    assert code == 0, err
    assert predictions(tmp_path / "out") == predictions(written / "run")


@pytest.mark.parametrize("text, key", [
    ("method: direct-r\nkk: 3\n", "'kk'"),
    ("method: direct-r\nmethod_options: {tag_threshold: 0.5}\n", "method_options.tag_threshold"),
    ("retriever: bm42\n", "retriever: 'bm42' is not one of"),
    ("k: zero\n", "k: expected a positive integer"),
    ("questions: <elsewhere>/dev.jsonl\n", "questions: cannot resolve '<elsewhere>/dev.jsonl'"),
    ("questions: no/such/dev.jsonl\n", "questions: cannot resolve 'no/such/dev.jsonl'"),
    ("- a list\n", "a run config is a mapping"),
    # values of the wrong type (issue #46, 4): each was a traceback, or ran one question silently (limit: true)
    ("questions: 5\n", "questions: expected a string, got 5"),
    ("reader: 7\n", "reader: expected a string, got 7"),
    ("dataset: 3\n", "dataset: expected a string, got 3"),
    ("answer_aliases: 3\n", "answer_aliases: expected a string, got 3"),
    ("llm: 7\n", "llm: expected a string, got 7"),
    ("limit: true\n", "limit: expected a value for N, got True"),
])
def test_a_bad_config_is_one_line_naming_file_and_key(text, key, tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    code, out, err = run(["eval", "--config", cfg, "--output", tmp_path / "out"], capsys)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith(f"effrag: error: {cfg}") and key in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    code, _, err = run(["eval", "--config", tmp_path / "nope.yaml", "--output", tmp_path / "out"], capsys)
    assert code == 2 and err.count("\n") == 1 and "nope.yaml" in err


def test_the_shipped_example_config_runs(tmp_path, capsys):
    code, out, err = run(["eval", "--config", configs.path("eval"), "--limit", 2, "--cache-dir", tmp_path / "cache",
                          "--output", tmp_path / "out"], capsys)
    assert code == 0, err
    run_cfg = json.loads((tmp_path / "out" / "config.json").read_text())["run"]
    assert run_cfg["method"] == "direct-r" and run_cfg["retriever"] == "bm25" and run_cfg["k"] == [2, 5, 10]
    assert run_cfg["questions"] == str(HOTPOT_DEV) and len(predictions(tmp_path / "out")) == 2
    assert "| direct-r | hotpotqa | bm25 | 10 | 2 |" in out
    # by name, as train.py takes its configs
    assert run(["eval", "--config", "eval", "--limit", 1, "--cache-dir", tmp_path / "cache",
                "--output", tmp_path / "byname"], capsys)[0] == 0


def test_a_recorded_k_replays_only_where_the_method_used_it():
    """config.json records k (default 10) even when --k was left out; EfficientRAG's depth then came from its loop
    config, so a replay must leave --k out too."""
    recorded = {"method": "efficientrag", "_recorded": True, "method_options": {"hop_k": None}}
    assert _recorded_k({**recorded, "method_config": {"hop_k": 4}}, {"k": [10]}) == {}
    assert _recorded_k({**recorded, "method_config": {"hop_k": 10}}, {"k": [10]}) == {"k": [10]}
    given = {**recorded, "method_options": {"hop_k": 3}, "method_config": {"hop_k": 3}}
    assert _recorded_k(given, {"k": [7]}) == {"k": [7]}
    assert _recorded_k({"method": "direct-r", "method_config": {"hop_k": 4}}, {"k": [5]}) == {"k": [5]}
