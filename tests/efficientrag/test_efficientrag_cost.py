"""EfficientRAG loop cost options (issue #18): int8, the levers retired on 2026-11-29, and the cost benchmark.

Real tiny models (tests/conftest.py ``tiny_efficientrag_dirs``) and real BM25 over the bundled HotpotQA sample.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import hotpot_dev

from effrag.data import Corpus
from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop, build_config, int8_copy

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def hotpot():
    return hotpot_dev(30)


@pytest.fixture(scope="module")
def corpus(hotpot):
    return Corpus.from_questions(hotpot)


@pytest.fixture(scope="module")
def retriever(corpus):
    from effrag.retrieval import build_retriever

    return build_retriever("bm25", corpus, show_progress=False)


@pytest.fixture(scope="module")
def questions(hotpot):
    return [q.question for q in hotpot[:6]]


@pytest.fixture(scope="module")
def models(tiny_efficientrag_dirs):
    from effrag.models import FilterModel, LabelerModel

    return (LabelerModel.from_pretrained(tiny_efficientrag_dirs["labeler"]).eval(),
            FilterModel.from_pretrained(tiny_efficientrag_dirs["filter"]).eval())


def pools(results):
    return [[(c.id, round(c.score, 6), c.fallback) for c in r.chunks] for r in results]


def n_pairs(results):
    return sum(len(e["chunks"]) for r in results for e in r.hops)


# ---------------------------------------------------------------------- config

def test_cost_options_default_off_and_left_out_of_to_json():
    cfg = EfficientRAGConfig()
    assert cfg.int8 is False and "int8" not in cfg.to_json()  # old configs still match
    on = cfg.replace(int8=True)
    assert on.to_json()["int8"] is True and build_config(on.to_json()) == on


@pytest.mark.parametrize("lever", ["stop_at_pool", "prune_last_hop", "relabel_weight"])
def test_retired_levers_are_refused_by_name(tmp_path, lever):
    """relabel_weight, prune_last_hop and stop_at_pool left the config (no shipped config used them, none measured a
    gain): a file or a flag naming one is refused in one line, not silently ignored."""
    import argparse
    import json

    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline

    with pytest.raises(ValueError, match=f"unknown EfficientRAGConfig option.*{lever}"):
        EfficientRAGConfig.from_dict({lever: 1})
    path = tmp_path / "loop.json"
    path.write_text(json.dumps({"config": {"hop_k": 5, lever: 1}}))
    with pytest.raises(ValueError, match=f"loop.json: unknown EfficientRAGConfig option.*config.{lever}"):
        build_config(str(path))
    p = argparse.ArgumentParser()
    EfficientRAGPipeline.add_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--" + lever.replace("_", "-"), "1"])


def test_eval_flags_reach_the_config(tiny_efficientrag_dirs, retriever):
    import argparse

    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline

    p = argparse.ArgumentParser()
    EfficientRAGPipeline.add_args(p)
    a = p.parse_args(["--er-int8", "--labeler-max-length", "96"])
    assert (a.int8, a.labeler_max_length) == (True, 96)
    assert p.parse_args([]).int8 is None  # off unless given: a config file's value is not overridden
    pipe = EfficientRAGPipeline(retriever, labeler=tiny_efficientrag_dirs["labeler"],
                                filter=tiny_efficientrag_dirs["filter"], int8=True, labeler_max_length=96)
    assert pipe.config.int8 and pipe.config.labeler_max_length == 96


# ---------------------------------------------------------------------- int8

def test_int8_copy_is_close_and_leaves_the_model_alone(models, hotpot):
    lab, fil = models
    q = int8_copy(lab)
    layer, qlayer = lab.encoder.encoder.layer[0], q.encoder.encoder.layer[0]
    assert type(layer.intermediate.dense) is torch.nn.Linear  # the original is untouched
    assert q is not lab and type(qlayer.intermediate.dense) is not torch.nn.Linear  # int8
    assert type(qlayer.output.dense) is torch.nn.Linear and type(q.token_head.proj) is torch.nn.Linear  # fp32
    queries = [h.question for h in hotpot[:8]]
    chunks = [[w for p in h.contexts[:1] for w in (p.title + " " + p.text).split()][:60] for h in hotpot[:8]]
    ref, got = lab.predict(queries, chunks), q.predict(queries, chunks)
    tag_diff = max(abs(a[0] - b[0]) for a, b in zip(ref, got))
    word_diff = [abs(x - y) for a, b in zip(ref, got) for x, y in zip(a[1], b[1])]
    assert tag_diff < 0.1 and sum(word_diff) / len(word_diff) < 0.05  # heads x40: the tiny model is touchy
    fref, fgot = fil.predict(chunks), int8_copy(fil).predict(chunks)
    fdiff = [abs(x - y) for a, b in zip(fref, fgot) for x, y in zip(a, b)]
    assert sum(fdiff) / len(fdiff) < 0.05


def test_int8_loop_runs_and_quantizes_once(models, retriever, questions):
    lab, fil = models
    loop = EfficientRAGLoop(lab, fil, retriever, EfficientRAGConfig(hop_k=3, max_hops=2, int8=True))
    r1 = loop.run(questions)
    first = loop._lab
    assert first is not lab and loop.labeler is lab
    assert pools(loop.run(questions)) == pools(r1) and loop._lab is first  # the copy is made once
    loop.config = loop.config.replace(int8=False)
    loop.run(questions[:1])
    assert loop._lab is lab


# ---------------------------------------------------------------------- the benchmark's core

def test_loop_cost_measures_a_tiny_setup(models, retriever, corpus, hotpot):
    """effrag.tuning.loop_cost (scripts/bench_loop_cost.py's measuring): every variant's cost, recall and pools."""
    from effrag.data import map_gold
    from effrag.tuning import loop_cost as bench

    qs = hotpot[:4]
    setup = SimpleNamespace(texts=[q.question for q in qs], gold=map_gold(qs, corpus), retriever=retriever,
                            corpus=corpus)
    lab, fil = models
    base = EfficientRAGConfig(hop_k=3, max_hops=2, tag_threshold=0.3)
    out = bench.measure(setup, lab, fil, base, {"baseline": {}, "int8": {"int8": True},
                                                "batch2": {"batch_size": 2}},
                        batch=2, single=1, unit_pairs=8, log=lambda m: None)
    rows = {r["name"]: r for r in out["rows"]}
    b = rows["baseline"]
    assert b["identical"] and set(rows) == {"baseline", "int8", "batch2"}
    assert b["pairs_per_q"] > 0 and b["unit_s"] > 0 and b["ratio"] > 0 and 0 <= b["recall"] <= 1
    assert b["plain_all_s_per_q"] > 0 and set(b["stages"]) == {"retrieval", "labeler", "filter", "other"}
    assert "| baseline |" in bench.report(out, b["recall"])
    assert out["prepared"]["passages"] == len(corpus) and out["prepared"]["seconds"] > 0  # split before the questions
    unprepared = bench.measure(setup, lab, fil, base, {"baseline": {}}, batch=2, single=1, unit_pairs=8,
                               log=lambda m: None, prepare=False)
    assert unprepared["prepared"]["passages"] == 0
    assert unprepared["rows"][0]["recall"] == b["recall"]


def test_a_gpu_run_warms_up_on_a_whole_batch(models, retriever):
    """One question warms a CPU; a GPU picks kernels per shape, so its warm-up is a whole batch (the device is read
    off the Labeler: a CUDA device object is enough to choose, no GPU runs here)."""
    from effrag.tuning.loop_cost import warmup_size

    lab, fil = models
    loop = EfficientRAGLoop(lab, fil, retriever, EfficientRAGConfig(hop_k=3, max_hops=2))
    assert warmup_size(loop, 32) == 1
    gpu_loop = SimpleNamespace(labeler=SimpleNamespace(device=torch.device("cuda", 0)))
    assert warmup_size(gpu_loop, 32) == 32 and warmup_size(SimpleNamespace(), 32) == 1


def test_a_report_measured_on_an_uncommitted_tree_says_so(tmp_path):
    """The loop-cost bench names the commit its figures were measured on: a tree with changed tracked files must not
    pass for the commit before the change (new untracked files, e.g. the report being written, do not count)."""
    import subprocess

    from effrag.provenance import source_commit

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert source_commit(tmp_path) == "unknown"  # not a checkout
    git("init", "-q")
    (tmp_path / "loop.json").write_text("{}\n")
    git("add", "loop.json")
    git("commit", "-qm", "config")
    head = git("rev-parse", "--short", "HEAD")
    assert source_commit(tmp_path) == head
    (tmp_path / "report.md").write_text("new\n")
    assert source_commit(tmp_path) == head
    (tmp_path / "loop.json").write_text('{"hop_k": 3}\n')
    assert source_commit(tmp_path) == f"{head} + uncommitted changes"


def test_the_pareto_table_names_the_ranker_a_bench_read_with_and_marks_only_what_ships(tmp_path):
    """scripts/loop_cost_pareto.py: a bench report names the ranker it read with, so a row keeps its ranker after the
    shipped config moves to another; *ships* marks a row that read exactly the shipped config, not every row a bench
    called "shipped" when it ran."""
    import json
    import shutil
    from pathlib import Path

    from helpers import run_script

    root = Path(__file__).resolve().parents[2]
    bench = tmp_path / "bench"
    shutil.copytree(root / "reports" / "archive" / "efficientrag" / "loop-cost" / "cpu-v5-hotpotqa", bench)
    report = json.loads((bench / "report.json").read_text())
    report["setup"]["ranker"] = "ranker-teacher"  # as if the bench had read with the teacher
    report["setup"]["ranker_length"] = 192
    old = next(r for r in report["rows"] if r["name"] == "shipped")
    report["rows"].append({**old, "name": "student"})
    (bench / "report.json").write_text(json.dumps(report))
    out = tmp_path / "pareto.md"
    proc = run_script("loop_cost_pareto", "--bench", bench, "--output", out,
                      "--crossfit", root / "reports" / "efficientrag" / "crossfit" / "crossfit.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")] for line in out.read_text().splitlines()
            if line.startswith("| hotpotqa |")}
    assert "shipped" not in rows  # the bench's base row read something else than what ships
    rows["shipped"] = rows["its system's config"]
    assert rows["shipped"][3] == "ranker-teacher" and "(ships)" not in rows["shipped"][2]
    cf = json.loads((root / "reports" / "efficientrag" / "crossfit" / "crossfit.json").read_text())
    teacher = next(c for c in cf["pareto"]["hotpotqa"] if c["point"] == {
        "first_hop_k": 15, "hop_k": 5, "labeler_top": 2, "max_hops": 2, "rescore_top": 10, "ranker": "ranker-teacher"})
    assert rows["shipped"][10] == f"{100 * teacher['recall']['5']:.1f}"  # the teacher's recall at that point
    # the shipped HotpotQA config reads with the late-interaction ranker: as the bench ran it, it ships
    report["setup"]["ranker"], report["setup"]["ranker_length"] = "ranker-late", 128
    (bench / "report.json").write_text(json.dumps(report))
    proc = run_script("loop_cost_pareto", "--bench", bench, "--output", out,
                      "--crossfit", root / "reports" / "efficientrag" / "crossfit" / "crossfit.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in out.read_text().splitlines() if line.startswith("| hotpotqa |")]
    assert sum("**(ships)**" in line for line in lines) == 2  # "shipped" and its copy: the same point
    assert all(line.split("|")[3].strip() == "ranker-late" for line in lines)
