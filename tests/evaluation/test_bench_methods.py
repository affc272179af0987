"""scripts/bench_methods.py run as a user runs it: the per-dataset loop configs it resolves
(effrag.pipelines.efficientrag.system.dataset_config), the table of a stopped run with the speed-up notes, and the
early stop on a missing loop config."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_script

from effrag.pipelines.efficientrag.system import dataset_config

ROOT = Path(__file__).parents[2]


def test_er_config_is_a_file_or_a_directory_of_loop_configs(tmp_path):
    shipped = ROOT / "effrag" / "pretrained" / "efficientrag-all"
    assert dataset_config(shipped, "musique") == str(shipped / "loop-musique.json")
    assert dataset_config(shipped / "loop-hotpotqa.json", "musique") == str(shipped / "loop-hotpotqa.json")
    assert dataset_config(None, "hotpotqa") is None
    with pytest.raises(FileNotFoundError, match="no loop-bamboogle.json"):
        dataset_config(shipped, "bamboogle")
    with pytest.raises(FileNotFoundError, match="no such file"):
        dataset_config(tmp_path / "missing", "hotpotqa")


def _run(out: Path, method: str, dataset: str, n: int, latency: float, cpu: list[float], f1: float) -> None:
    """A finished run folder as the runner leaves it: metrics.json and predictions rows (write_row's fields)."""
    run = out / dataset / method
    run.mkdir(parents=True)
    entry = {"method": method, "dataset": dataset, "n": n, "recall": 0.5, "avg_chunks": 10.0, "em": 0.0,
             "f1": f1, "llm_calls": 1.0, "prompt_tokens": 900.0, "completion_tokens": 9.0, "latency_s": latency}
    (run / "metrics.json").write_text(json.dumps([entry]))
    rows = [{"qid": f"q{i}", "dataset": dataset, "question": "Q?", "gold": ["a"], "answers": ["x"],
             "latency_s": latency, "retrieved": ["a"], "scores": [1.0], "cpu_s": c, "parse_failures": 0}
            for i, c in enumerate(cpu)]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_only_tabulates_finished_runs_names_the_missing_and_the_speedups(tmp_path):
    out = tmp_path / "bench"
    _run(out, "direct-r", "hotpotqa", 2, 2.5, [3.0, 5.0], 0.25)
    _run(out, "efficientrag", "hotpotqa", 2, 2.0, [4.0, 4.0], 0.3)
    _run(out, "iter-retgen", "hotpotqa", 2, 10.0, [], 0.3)  # no CPU seconds recorded
    _run(out, "ircot", "musique", 2, 5.0, [5.0, 5.0], 0.1)  # no EfficientRAG run on musique: no ratio
    proc = run_script("bench_methods", "--questions", "x.jsonl", "--output", out, "--report-only",
                      "--methods", "direct-r", "efficientrag", "ircot", "iter-retgen")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "bench.json").read_text())
    assert [(r["dataset"], r["method"]) for r in data["rows"]] == [
        ("hotpotqa", "direct-r"), ("hotpotqa", "efficientrag"), ("hotpotqa", "iter-retgen"), ("musique", "ircot")]
    assert data["rows"][0]["cpu_s"] == 4.0 and data["rows"][0]["f1"] == 0.25
    assert "hotpotqa ircot: not run (no metrics.json)" in data["notes"]
    assert "musique efficientrag: not run (no metrics.json)" in data["notes"]
    # EfficientRAG's speed-up: the other method's latency and CPU seconds per question over EfficientRAG's
    assert "hotpotqa: EfficientRAG is 5.0x faster than iter-retgen in latency, - in CPU seconds per question" \
        in data["notes"]
    assert not any(n.startswith("musique: EfficientRAG") or "than ircot" in n for n in data["notes"])
    md = (out / "bench.md").read_text()
    assert "| direct-r | hotpotqa | 2 |" in md and md in proc.stdout + "\n"


def test_a_missing_loop_config_stops_the_run_before_the_index_is_built(tmp_path):
    sample = ROOT / "effrag" / "data" / "sample"
    only_hotpot = tmp_path / "er"
    only_hotpot.mkdir()
    (only_hotpot / "loop-hotpotqa.json").write_text("{}")
    out = tmp_path / "out"
    proc = run_script("bench_methods", "--questions", sample / "hotpotqa" / "dev.jsonl", sample / "musique" / "dev.jsonl",
                      "--retriever", "dense", "--methods", "direct-r", "efficientrag", "--labeler", "L",
                      "--filter", "F", "--er-config", only_hotpot, "--output", out, cwd=tmp_path,
                      env={"EFFRAG_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == \
        f"bench_methods: error: --er-config {only_hotpot} has no loop-musique.json for musique"
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing ran, no index was built
