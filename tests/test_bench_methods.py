"""scripts/bench_methods.py: per-dataset loop configs, the speed-up notes and the table of a stopped run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench_methods")


def test_er_config_is_a_file_or_a_directory_of_loop_configs(bench, tmp_path):
    shipped = ROOT / "effrag" / "pretrained" / "efficientrag-all"
    assert bench.loop_config(shipped, "musique") == str(shipped / "loop-musique.json")
    assert bench.loop_config(shipped / "loop-hotpotqa.json", "musique") == str(shipped / "loop-hotpotqa.json")
    assert bench.loop_config(None, "hotpotqa") is None
    with pytest.raises(SystemExit, match="no loop-bamboogle.json"):
        bench.loop_config(shipped, "bamboogle")
    with pytest.raises(SystemExit, match="no such file"):
        bench.loop_config(tmp_path / "missing", "hotpotqa")


def _row(method, dataset, latency, cpu):
    return {"method": method, "dataset": dataset, "latency_s": latency, "cpu_s": cpu}


def test_speedups_divide_the_llm_loops_cost_by_efficientrags(bench):
    table = [_row("efficientrag", "hotpotqa", 2.0, 4.0), _row("ircot", "hotpotqa", 20.0, 30.0),
             _row("iter-retgen", "hotpotqa", 10.0, None), _row("ircot", "musique", 5.0, 5.0)]
    lines = bench.speedups(table)
    assert lines == ["hotpotqa: EfficientRAG is 10.0x faster than ircot in latency, 7.5x in CPU seconds per question",
                     "hotpotqa: EfficientRAG is 5.0x faster than iter-retgen in latency, - in CPU seconds per question"]


def test_report_only_tabulates_finished_runs_and_names_the_missing(bench, tmp_path):
    out = tmp_path / "bench"
    run = out / "hotpotqa" / "direct-r"
    run.mkdir(parents=True)
    entry = {"method": "direct-r", "dataset": "hotpotqa", "n": 2, "recall": 0.5, "avg_chunks": 10.0, "em": 0.0,
             "f1": 0.25, "llm_calls": 1.0, "prompt_tokens": 900.0, "completion_tokens": 9.0, "latency_s": 2.5}
    (run / "metrics.json").write_text(json.dumps([entry]))
    rows = [{"qid": f"q{i}", "dataset": "hotpotqa", "question": "Q?", "gold": ["a"], "answers": ["x"],
             "latency_s": 2.5, "retrieved": ["a"], "scores": [1.0], "cpu_s": c, "parse_failures": 0}
            for i, c in enumerate((3.0, 5.0))]  # predictions rows as the runner writes them (write_row)
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--questions", "x.jsonl", "--output", str(out), "--report-only",
                       "--methods", "direct-r", "ircot"]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["direct-r"]
    assert data["rows"][0]["cpu_s"] == 4.0 and data["rows"][0]["f1"] == 0.25
    assert "hotpotqa ircot: not run (no metrics.json)" in data["notes"]
    assert "| direct-r | hotpotqa | 2 |" in (out / "bench.md").read_text()


def test_a_missing_loop_config_stops_the_run_before_the_index_is_built(bench, tmp_path):
    sample = ROOT / "effrag" / "data" / "sample"
    only_hotpot = tmp_path / "er"
    only_hotpot.mkdir()
    (only_hotpot / "loop-hotpotqa.json").write_text("{}")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="no loop-musique.json for musique"):
        bench.main(["--questions", str(sample / "hotpotqa" / "dev.jsonl"), str(sample / "musique" / "dev.jsonl"),
                    "--retriever", "dense", "--methods", "direct-r", "efficientrag", "--labeler", "L",
                    "--filter", "F", "--er-config", str(only_hotpot), "--output", str(out)])
    assert not out.exists()  # nothing ran, no index was built
