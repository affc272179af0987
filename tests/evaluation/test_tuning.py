"""Loop tuning (effrag.tuning): grid parsing, cached model calls, scores, caps within a chunk budget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_script

from effrag.pipelines.result import Chunk, Result
from effrag.retrieval.base import Hit
from effrag.tuning import (
    CachedModel,
    CachedRetriever,
    best_per_budget,
    best_within,
    candidates,
    direct_r_curve,
    model_fingerprint,
    parse_grid,
    score_results,
)


def test_parse_grid_products_and_types():
    grid = parse_grid(["hop_k=5,10", "pool_source=seen,continue", "retrieval_weight=0.5"])
    assert len(grid) == 4
    assert grid[0] == {"hop_k": 5, "pool_source": "seen", "retrieval_weight": 0.5}
    assert {g["hop_k"] for g in grid} == {5, 10} and all(isinstance(g["hop_k"], int) for g in grid)
    assert parse_grid(["query_chunks=1,none", "int8=true,False"]) == [
        {"query_chunks": 1, "int8": True}, {"query_chunks": 1, "int8": False},
        {"query_chunks": None, "int8": True}, {"query_chunks": None, "int8": False}]
    tied = parse_grid(["first_hop_k+hop_k=30+10,10+5", "max_hops=2,3"])  # moved together: 2 points, not 4
    assert tied == [{"first_hop_k": 30, "hop_k": 10, "max_hops": 2}, {"first_hop_k": 30, "hop_k": 10, "max_hops": 3},
                    {"first_hop_k": 10, "hop_k": 5, "max_hops": 2}, {"first_hop_k": 10, "hop_k": 5, "max_hops": 3}]
    assert parse_grid(["max_hops+rank_query=3+info"]) == [{"max_hops": 3, "rank_query": "info"}]
    for bad, msg in (("hop_k+hop_k=5+5", "expected NAME"), ("hop_k+max_hops=5", "1 parts for 2 names"),
                     ("hop_k+max_hops=5+x", "bad value"), ("hopk+max_hops=5+2", "expected NAME")):
        with pytest.raises(ValueError, match=msg):
            parse_grid([bad])
    for bad, msg in (("hopk=5", "expected NAME"), ("hop_k=five", "bad value"), ("hop_k=", "no values"),
                     ("batch_size=8", "expected NAME"), ("hop_k=none", "bad value"), ("int8=yes", "bad value")):
        with pytest.raises(ValueError, match=msg):
            parse_grid([bad])


class Counting:
    def __init__(self):
        self.calls = []

    def predict(self, *args, **kw):
        self.calls.append(args)
        return [len(a) for a in args[0]]

    def search(self, queries, k):
        self.calls.append((tuple(queries), k))
        return [[q] * k for q in queries]


def test_cached_model_and_retriever_call_once_per_input():
    m = Counting()
    cached = CachedModel(m, pairs=True)
    assert cached.predict(["q1", "q2", "q1"], [["a"], ["b"], ["a"]]) == [2, 2, 2]
    assert cached.predict(["q1", "q3"], [["a"], ["c"]]) == [2, 2]
    assert m.calls == [(["q1", "q2"], [["a"], ["b"]]), (["q3"], [["c"]])]  # only new inputs reach the model
    cached.predict(["q1"], [["a"]], max_length=128, batch_size=8)  # another input length: another output
    cached.predict(["q1"], [["a"]], max_length=128, batch_size=64)  # the batch size changes nothing
    assert m.calls[2:] == [(["q1"], [["a"]])]
    r = Counting()
    cr = CachedRetriever(r)
    cr.search(["a", "b"], 3)
    cr.search(["b", "c"], 3)
    cr.search(["b"], 5)
    assert r.calls == [(("a", "b"), 3), (("c",), 3), (("b",), 5)]


def result(ids, seen_extra=()):
    chunks = [Chunk(id=i, title=i, text="", score=0.5, hop=0) for i in ids]
    trace = [{"chunks": [{"id": i} for i in [*ids, *seen_extra]]}]
    return Result(question="q", chunks=chunks, trace=trace, iterations=1, timing={})


def test_score_results_recall_seen_and_curve():
    results = [result(["a", "x", "b"]), result(["y"], seen_extra=["c"])]
    gold = [["a", "b"], ["c", "d"]]
    s = score_results(results, gold, curve_max=3)
    assert s["recall"] == pytest.approx((1.0 + 0.0) / 2)
    assert s["seen_recall"] == pytest.approx((1.0 + 0.5) / 2)
    assert s["avg_chunks"] == 2.0 and s["avg_seen"] == 2.5
    # cut at 1: a (1/2) + nothing; at 2: same; at 3: a, b -> 1.0; chunks min(c, len)
    assert s["curve"] == [[1, 0.25, 1.0], [2, 0.25, 1.5], [3, 0.5, 2.0]]
    with pytest.raises(ValueError):
        score_results(results, gold[:1])


def row(recall, chunks, curve, cap=None, name="r"):
    return {"config": {"max_candidates": cap, "name": name}, "recall": recall, "avg_chunks": chunks, "curve": curve}


def test_caps_compete_within_a_budget():
    wide = row(0.9, 12.0, [[5, 0.70, 5.0], [7, 0.84, 7.0], [10, 0.88, 10.0]], name="wide")
    narrow = row(0.80, 6.5, [[5, 0.78, 5.0], [7, 0.80, 6.5]], name="narrow")
    best = best_within([wide, narrow], 7)
    assert best["config"] == {"max_candidates": 7, "name": "wide"} and best["recall"] == 0.84
    assert best_within([wide, narrow], 5.5)["config"]["name"] == "narrow"
    assert best_within([wide], 3) is None
    assert best_within([wide, narrow], None)["recall"] == 0.9  # no budget: the uncapped run
    capped = row(0.8, 5.0, [[5, 0.8, 5.0], [6, 0.8, 5.0]], cap=5)
    assert [c["config"]["max_candidates"] for c in candidates([capped], None)] == [5]  # no cap above its own
    per = best_per_budget([wide, narrow], [5, 7, 10])
    assert [(p["budget"], p["recall"]) for p in per] == [(5, 0.78), (7, 0.84), (10, 0.88)]


def test_direct_r_curve():
    class R:
        def search(self, queries, k):
            return [[Hit(id=i, score=1.0, title=i, text="") for i in ("a", "x", "b", "y")][:k] for _ in queries]

    curve = direct_r_curve(R(), ["q1", "q2"], [["a", "b"], ["z"]], 3)
    assert [c["recall"] for c in curve] == [0.25, 0.25, 0.5]
    assert [c["avg_chunks"] for c in curve] == [1.0, 2.0, 3.0]


def test_the_recipe_grid_is_a_yaml_file_and_a_bad_one_names_its_item(tmp_path):
    """effrag/configs/efficientrag_recipe.yaml holds the grid scripts/train_efficientrag.sh tunes (TUNE_GRID used to
    hold it in the script: the same items); scripts/tune_efficientrag.py --grid-file reads it."""
    from effrag import configs
    from effrag.tuning import read_grid_file

    items = read_grid_file(configs.path("efficientrag_recipe"))
    grid = parse_grid(items)
    names = {name for item in items for name in item.split("=", 1)[0].split("+")}  # tied items: each name
    # the pool-ranking loop the shipped configs come from, and the weights the tuner ranks one run under
    assert {"pool_order", "rank_query", "rescore_top", "retrieval_weight", "requery_weight", "labeler_top"} <= names
    assert all(c["pool_order"] == "rank" for c in grid) and len(grid) >= 2 * 2 * 2 * 3 * 3
    recipe = (configs.path("labeler").parents[2] / "scripts" / "train_efficientrag.sh").read_text()
    assert "--grid-file effrag/configs/efficientrag_recipe.yaml" in recipe and 'read -ra grid_args <<< "$TUNE_GRID"' in recipe
    bad = tmp_path / "grid.yaml"
    bad.write_text("grid:\n  - hop_k=5,10\n  - tag_treshold=0.3\n")
    with pytest.raises(ValueError, match=rf"^{bad}: grid\[1\]: bad grid item 'tag_treshold=0.3'"):
        read_grid_file(bad)
    bad.write_text("grid: hop_k=5\n")
    with pytest.raises(ValueError, match="expected `grid:` as a list of NAME=V1,V2 strings"):
        read_grid_file(bad)


def test_run_grid_writes_the_tuning_folder_and_resumes(tiny_efficientrag_dirs, tmp_path):
    """A real (tiny) Labeler/Filter loop over BM25: every config scored once, best within the budget,
    a rerun pays nothing for finished configs, a widened grid runs only the new ones, a torn line is cut."""
    import json

    import torch

    from effrag.data import sample_path
    from effrag.pipelines import build_pipeline
    from effrag.setup import RunSetup
    from effrag.tuning import run_grid

    torch.set_num_threads(1)
    dev = sample_path("hotpotqa", "dev")
    setup = RunSetup.build(dev, limit=6, corpus_from=[dev], retriever="bm25", cache=False)

    def loop():
        return build_pipeline("efficientrag", setup.retriever, labeler=str(tiny_efficientrag_dirs["labeler"]),
                              filter=str(tiny_efficientrag_dirs["filter"]), hop_k=3, max_hops=2).loop

    meta = {"questions": str(dev), "n": len(setup.questions)}
    grid = parse_grid(["tag_threshold=0.2,0.8", "query_mode=merged,per_chunk"])
    out = tmp_path / "tune"
    first = run_grid(loop(), setup.texts, setup.gold, grid, out, meta, grid_spec=["a"], chunk_budget=4,
                     curve_max=5, direct_k_max=8, show_progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {tuple(sorted(r["changes"].items())) for r in rows} == \
        {tuple(sorted(c.items())) for c in grid}
    best = json.loads((out / "best.json").read_text())
    assert best["metrics"]["avg_chunks"] <= 4 and best["setup"] == meta
    assert best["metrics"]["recall"] == max(c["recall"] for c in candidates(rows, 4))
    curve = json.loads((out / "curve.json").read_text())
    assert [d["k"] for d in curve["direct_r"]] == list(range(1, 9)) and len(curve["efficientrag"]) <= 5
    table = (out / "table.md").read_text()
    assert table.splitlines()[2].startswith("| query_mode | tag_threshold | recall |") and "| * |" in table

    rerun_loop = loop()
    again = run_grid(rerun_loop, setup.texts, setup.gold, grid, out, meta, grid_spec=["a"], chunk_budget=4,
                     curve_max=5, direct_k_max=8, show_progress=False)
    assert again["best"] == first["best"] and len(rerun_loop.labeler.cache) == 0  # no model call on a rerun

    with (out / "results.jsonl").open("a") as f:
        f.write('{"config": {"torn')  # a run killed mid-write
    wider = parse_grid(["tag_threshold=0.2,0.5,0.8", "query_mode=merged,per_chunk"])
    run_grid(loop(), setup.texts, setup.gold, wider, out, meta, grid_spec=["b"], chunk_budget=4, curve_max=5,
             direct_k_max=8, show_progress=False)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["setup"] == meta for line in lines)
    assert json.loads((out / "tune_config.json").read_text())["grids"] == [["a"], ["b"]]


def test_tuning_setup_is_the_run_identity_and_rows_of_another_schema_never_resume(tiny_efficientrag_dirs, tmp_path):
    """``tuning_setup`` = the run identity (with its schema) + the grid's models; a row whose setup predates the
    identity's schema does not match, nor does a changed model; the shipped form has no paths."""
    from effrag.data import sample_path
    from effrag.pipelines.efficientrag.config import EfficientRAGConfig
    from effrag.setup import IDENTITY_KEYS, RunSetup, same_run
    from effrag.tuning import tuning_setup
    from effrag.tuning.loop_configs import portable_setup

    dev = sample_path("hotpotqa", "dev")
    run = RunSetup.build(dev, limit=3, corpus_from=[dev], retriever="bm25", cache=False)
    d = tiny_efficientrag_dirs
    setup = tuning_setup(run, d["labeler"], d["filter"], None, EfficientRAGConfig(), seed=0)
    assert set(IDENTITY_KEYS) <= set(setup) and setup["corpus_fingerprint"] == run.identity()["corpus_fingerprint"]
    older = {k: setup[k] for k in ("questions", "n", "seed", "retriever", "corpus_fingerprint", "labeler", "filter",
                                   "base_config", "model_files")}
    assert not same_run(older, setup) and same_run(dict(setup), setup)
    assert not same_run({**setup, "model_files": {"labeler": "x", "filter": "y"}}, setup)
    shipped = portable_setup(setup)
    assert shipped["questions"] == "hotpotqa/dev.jsonl" and shipped["corpus_from"] == ["hotpotqa/dev.jsonl"]
    assert shipped["labeler"] == "labeler" and not any(isinstance(v, str) and v.startswith("/") for v in shipped.values())


def test_configs_that_differ_after_the_loop_share_one_run_and_score_as_alone(tiny_efficientrag_dirs, tmp_path):
    """Pool options (order, weights, caps) re-rank one loop run's states: the rows equal separate runs, and the
    loop's models read each input once for the whole grid."""
    import json

    import torch

    from effrag.data import sample_path
    from effrag.pipelines import build_pipeline
    from effrag.setup import RunSetup
    from effrag.tuning import loop_key, run_grid, score_results

    torch.set_num_threads(1)
    dev = sample_path("hotpotqa", "dev")
    setup = RunSetup.build(dev, limit=5, corpus_from=[dev], retriever="bm25", cache=False)
    d = tiny_efficientrag_dirs

    def loop():
        return build_pipeline("efficientrag", setup.retriever, labeler=str(d["labeler"]), filter=str(d["filter"]),
                              ranker=str(d["ranker"]), hop_k=3, max_hops=2, tag_threshold=0.3,
                              pool_source="seen", pool_order="rank").loop

    grid = parse_grid(["pool_order=rank,fused_logit", "retrieval_weight=0,2", "requery_weight=0,1",
                       "token_threshold=0.3,0.6"])
    assert len({loop_key(loop().config.replace(**c)) for c in grid}) == 2
    ids = [q.id for q in setup.questions]
    tuned = loop()
    run_grid(tuned, setup.texts, setup.gold, grid, tmp_path / "t", {"n": 5}, curve_max=5, direct_k_max=5,
             show_progress=False, ids=ids)
    rows = {json.dumps(r["changes"], sort_keys=True): r
            for r in map(json.loads, (tmp_path / "t" / "results.jsonl").read_text().splitlines())}
    assert len(rows) == len(grid)
    alone = loop()
    for changes in grid:
        alone.config = alone.config.replace(**changes)
        want = score_results(alone.run(setup.texts), setup.gold, 5, ids=ids)
        got = rows[json.dumps(changes, sort_keys=True)]
        assert got["per_question"] == want["per_question"] and got["curve"] == want["curve"]


def test_probe_pool_ranking_compares_orders_within_the_seen_ceiling(tiny_efficientrag_dirs, tmp_path):
    """scripts/probes/probe_pool_ranking.py: the config's order, a cross-validated learned order and the oracle
    order of the seen chunks; no order beats the oracle, and bad options are usage errors."""
    import json

    from effrag.data import sample_path

    cfg = tmp_path / "loop.json"
    cfg.write_text(json.dumps({"config": {"hop_k": 4, "max_hops": 2, "tag_threshold": 0.3, "pool_order": "fused",
                                          "requery_weight": 0.5, "max_candidates": 3}}))
    dev = sample_path("hotpotqa", "dev")
    out = tmp_path / "probe"
    args = ["--labeler", str(tiny_efficientrag_dirs["labeler"]), "--filter", str(tiny_efficientrag_dirs["filter"]),
            "--er-config", str(cfg), "--questions", str(dev), "--limit", "8", "--retriever", "bm25",
            "--folds", "2", "--output", str(out)]
    proc = run_script("probes/probe_pool_ranking", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    curves = report["curves"]
    assert set(curves) == {"config", "learned (CV)", "learned (in-sample)", "oracle order of the seen chunks",
                           "Direct-R@k"}
    assert all(len(v) == 10 for v in curves.values())
    oracle = curves["oracle order of the seen chunks"]
    for name in ("config", "learned (CV)", "learned (in-sample)"):
        assert all(a <= b + 1e-9 for a, b in zip(curves[name], oracle)), name
        assert curves[name] == sorted(curves[name])  # a longer cut never holds less gold
    assert report["features"][0] == "labeler_logit" and len(report["weights"]) == len(report["features"]) > 3
    assert report["loop_config"]["requery_weight"] == 0.5
    assert "| learned (CV) |" in (out / "report.md").read_text()
    proc = run_script("probes/probe_pool_ranking", *args[:-4], "--folds", "1", "--output", out)
    assert proc.returncode == 2 and "--folds" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_model_fingerprint_follows_the_weights_not_the_path(tiny_efficientrag_dirs, tmp_path):
    import torch

    from effrag.models import LabelerModel

    path = tiny_efficientrag_dirs["labeler"]
    first = model_fingerprint(path)
    assert first and first == model_fingerprint(path)
    lab = LabelerModel.from_pretrained(path)
    lab.save_pretrained(tmp_path / "same")
    assert model_fingerprint(tmp_path / "same") == first  # same weights elsewhere: same fingerprint
    with torch.no_grad():
        lab.chunk_head.proj.bias.add_(1.0)
    lab.save_pretrained(tmp_path / "same")  # retrained in place: a tuning folder must not resume its rows
    assert model_fingerprint(tmp_path / "same") not in (None, first)
    assert model_fingerprint(tmp_path / "missing") is None


def test_summarize_tuning_groups_rows_and_takes_each_budgets_best(tmp_path):
    rows = [{"config": {"query_chunks": 1, "token_threshold": 0.2}, "seen_recall": 0.8, "avg_seen": 25.0,
             "curve": [[7, 0.60, 7], [10, 0.70, 10]]},
            {"config": {"query_chunks": 1, "token_threshold": 0.3}, "seen_recall": 0.9, "avg_seen": 24.0,
             "curve": [[7, 0.65, 7], [10, 0.68, 10]]},
            {"config": {"token_threshold": 0.3}, "seen_recall": 0.7, "avg_seen": 20.0,
             "curve": [[7, 0.50, 7], [10, 0.55, 10]]}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_script("summarize_tuning", tmp_path, "--by", "query_chunks")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # query_chunks=1: the best at 7 and at 10 come from different rows; the seen figures from the best at 10
    assert lines[2] == "| 1 | 65.00 | 70.00 | 80.00 | 25.0 | 2 |"
    assert lines[3] == "| default | 50.00 | 55.00 | 70.00 | 20.0 | 1 |"
    proc = run_script("summarize_tuning", tmp_path, "--by", "token_threshold", "--where", "query_chunks=1",
                      "--budgets", "10")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2:] == ["| 0.2 | 70.00 | 80.00 | 25.0 | 1 |", "| 0.3 | 68.00 | 90.00 | 24.0 | 1 |"]
    # --exclude-sample: scored from the per-question gold positions, the bundled sample's questions left out
    from effrag.data import load_questions, sample_path

    inside = load_questions(sample_path("hotpotqa", "dev"))[0].id
    row = {"config": {"max_hops": 1}, "curve": [[7, 0.5, 7]],
           "per_question": [[inside, 2, [], 10, [0, 0, 0]], ["elsewhere", 2, [1, 8], 10, [0, 0, 0]]]}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    proc = run_script("summarize_tuning", tmp_path, "--by", "max_hops", "--budgets", "7,10", "--exclude-sample")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2] == "| 1 | 50.00 | 100.00 |  |  | 1 |"
    (tmp_path / "results.jsonl").write_text("{not json\n")
    proc = run_script("summarize_tuning", tmp_path, "--by", "query_chunks")
    assert proc.returncode == 2 and "results.jsonl:1: not JSON" in proc.stderr


@pytest.mark.slow
def test_report_chooses_shipped_configs_and_cross_fits_them_against_three_retrievers(tiny_efficientrag_dirs, tmp_path):
    """scripts/tune_efficientrag.py then scripts/efficientrag_report.py on the bundled sample: the system folder
    gets loop-<dataset>.json and loop.json with their retriever, the questions that chose them and held-out
    figures; the tables compare with BM25, dense and hybrid Direct-R on the same questions."""
    import json
    import shutil

    from effrag.data import sample_path
    from effrag.pipelines.efficientrag.config import build_config
    from effrag.pipelines.efficientrag.system import open_system

    d = tiny_efficientrag_dirs
    data = sample_path("hotpotqa", "dev").parents[1]
    tune = tmp_path / "tune"
    args = ["--labeler", str(d["labeler"]), "--filter", str(d["filter"]), "--ranker", str(d["ranker"]),
            "--questions", str(data / "hotpotqa" / "dev.jsonl"), "--corpus-from", str(data / "hotpotqa" / "train.jsonl"),
            "--retriever", "bm25", "--limit", "8", "--n", "0", "--cache-dir", str(tmp_path / "idx"),
            "--grid", "first_hop_k=8", "hop_k=3", "max_hops=2", "tag_threshold=0.3", "pool_source=seen",
            "pool_order=rank", "retrieval_weight=0,1", "requery_weight=0,1", "--output", str(tune)]
    proc = run_script("tune_efficientrag", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tune / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["per_question"]) == 8 for r in rows)
    system = tmp_path / "system"
    for name in ("labeler", "filter", "ranker"):
        shutil.copytree(d[name], system / name)
    out = tmp_path / "report"
    proc = run_script("efficientrag_report", "--tune", f"hotpotqa={tune}", "--data", data, "--system", system,
                      "--output", out, "--keep-sample", "--folds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in ("loop.json", "loop-hotpotqa.json"):
        cfg = json.loads((system / f).read_text())
        assert cfg["retriever"] == "bm25" and cfg["config"]["max_candidates"] == 10
        assert set(cfg["crossfit"]["hotpotqa"]["recall"]) == {"7", "10"} and cfg["crossfit"]["hotpotqa"]["n"] == 8
        setup = cfg["setup"] if f != "loop.json" else cfg["setup"]["hotpotqa"]
        assert setup["questions"] == "hotpotqa/dev.jsonl"  # no machine path in a shipped file
        build_config(system / f)  # a valid loop config file
    assert open_system(system).retriever == "bm25" and open_system(system).config == system / "loop.json"
    assert open_system(system, dataset="hotpotqa").config == system / "loop-hotpotqa.json"
    table = (out / "table2.md").read_text()
    assert "bm25 @20" in table and "hybrid @30" in table and "cross-fitted (2 folds" in table
    report = json.loads((out / "crossfit.json").read_text())
    assert set(report["direct_r"]["hotpotqa"]) == {"bm25", "dense", "hybrid"}
    assert "## Dev figures (cross-fitted)" in (system / "README.md").read_text()
    assert "pair reads/q" in (out / "pareto.md").read_text() and report["pareto"]["hotpotqa"][0]["n"] == 8
    # the evidence written beside the tables rebuilds them alone: no data folder, no tuning folder
    again_out, again_system = tmp_path / "again", tmp_path / "again-system"
    proc = run_script("efficientrag_report", "--evidence", out / "evidence", "--data", tmp_path / "no-data",
                      "--output", again_out, "--system", again_system, "--keep-sample", "--folds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in ("table2.md", "curve.md", "pareto.md"):
        assert (again_out / f).read_text() == (out / f).read_text(), f
    assert (json.loads((again_system / "loop-hotpotqa.json").read_text())["config"]
            == json.loads((system / "loop-hotpotqa.json").read_text())["config"])
    # the cheapest config that keeps the bar, with a bar no config reaches: the best recall, as above
    first = json.loads((system / "loop-hotpotqa.json").read_text())["config"]
    proc = run_script("efficientrag_report", "--tune", f"hotpotqa={tune}", "--data", data, "--system", system,
                      "--output", out, "--keep-sample", "--folds", "2", "--rule", "cheapest", "--margin", "101")
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((system / "loop-hotpotqa.json").read_text())
    assert again["config"] == first
    assert again["chosen_on"]["rule"].startswith("cheapest that keeps the bar") and "+ 101 points" in \
        again["chosen_on"]["rule"]
    # other bars: at most 5 chunks against Direct-R@20; a malformed bar is one line naming the option
    proc = run_script("efficientrag_report", "--evidence", out / "evidence", "--output", tmp_path / "five",
                      "--keep-sample", "--folds", "2", "--budgets", "5", "10", "--targets", "5=20", "10=30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "target <= 5 chunks vs strongest @20" in (tmp_path / "five" / "table2.md").read_text()
    proc = run_script("efficientrag_report", "--evidence", out / "evidence", "--output", tmp_path / "bad",
                      "--targets", "5:20")
    assert proc.returncode == 2 and "--targets 5:20: expected CHUNKS=DEPTH" in proc.stderr
    # another ranker's tuning added to a report's evidence: its rows join the evidence's, each costed by its own
    # ranker, and the merged evidence is written; the same ranker's rows twice is one line
    from effrag.tuning.evidence import read_evidence

    shutil.copytree(d["ranker"], system / "ranker-other")
    merged = tmp_path / "merged"
    proc = run_script("efficientrag_report", "--evidence", out / "evidence", "--tune", f"hotpotqa={tune}@ranker-other",
                      "--data", tmp_path / "no-data", "--system", system, "--output", merged, "--keep-sample",
                      "--folds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = read_evidence(merged / "evidence" / "hotpotqa.json.gz")
    assert len(ev["rows"]) == 8
    assert sorted(r["config"].get("ranker", "ranker") for r in ev["rows"]) == ["ranker"] * 4 + ["ranker-other"] * 4
    assert set(ev["ranker_factor"]) == {"ranker", "ranker-other"}
    assert ev["direct_r"] == read_evidence(out / "evidence" / "hotpotqa.json.gz")["direct_r"]
    proc = run_script("efficientrag_report", "--evidence", out / "evidence", "--tune", f"hotpotqa={tune}",
                      "--data", tmp_path / "no-data", "--output", tmp_path / "twice", "--keep-sample", "--folds", "2")
    assert proc.returncode == 2 and "the evidence already holds hotpotqa's rows read with ranker" in proc.stderr


def test_the_committed_evidence_rebuilds_the_headline_table(tmp_path):
    """reports/efficientrag/crossfit/table2.md is recomputed from the repository alone (no data folder, no tuning
    run): one dev file's evidence gives the same Direct-R cells, the same cross-fitted loop-<dataset>.json recall at
    7 and 10 chunks and the same reads as the committed table (loop.json's cells are chosen jointly over the three
    files, so one file alone gives other ones)."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    report = root / "reports" / "efficientrag" / "crossfit"
    ev = tmp_path / "evidence"
    ev.mkdir()
    shutil.copy(report / "evidence" / "2wikimqa.json.gz", ev)
    out = tmp_path / "out"
    proc = run_script("efficientrag_report", "--evidence", ev, "--output", out, "--rule", "cheapest", "--margin", "se",
                      "--prefer", "simple",
                      "--data", tmp_path / "no-data")
    assert proc.returncode == 0, proc.stderr[-3000:]

    def row(path):
        line = next(x for x in path.read_text().splitlines() if x.startswith("| 2wikimqa ("))
        cells = [c.strip() for c in line.strip("|").split("|")]
        return cells[:15] + cells[17:18]
    assert row(out / "table2.md") == row(report / "table2.md")


@pytest.mark.slow
def test_tuning_a_system_reads_with_the_ranker_its_loop_config_names(tiny_efficientrag_dirs, tmp_path):
    """scripts/tune_efficientrag.py --model SYSTEM --er-config FILE tunes with the ranker FILE names (none: the
    system's ranker/), not the one of the system's loop.json: a 2Wiki config read by the student was once tuned with
    the teacher."""
    import json
    import shutil

    from effrag.data import sample_path

    d = tiny_efficientrag_dirs
    system = tmp_path / "system"
    for name, src in (("labeler", "labeler"), ("filter", "filter"), ("ranker", "ranker"), ("ranker-teacher", "ranker")):
        shutil.copytree(d[src], system / name)
    loop = {"first_hop_k": 8, "hop_k": 3, "max_hops": 2, "pool_source": "seen", "pool_order": "rank"}
    (system / "loop.json").write_text(json.dumps({"config": loop, "ranker": "ranker-teacher"}))
    (tmp_path / "student.json").write_text(json.dumps({"config": loop}))
    dev = sample_path("hotpotqa", "dev")
    for config, expected in ((tmp_path / "student.json", "ranker"), (system / "loop.json", "ranker-teacher")):
        out = tmp_path / f"tune-{expected}"
        proc = run_script("tune_efficientrag", "--model", system, "--er-config", config, "--questions", dev,
                          "--corpus-from", sample_path("hotpotqa", "train"), "--retriever", "bm25", "--limit", "2",
                          "--n", "0", "--cache-dir", tmp_path / "idx", "--grid", "max_hops=1", "--output", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        row = json.loads((out / "results.jsonl").read_text().splitlines()[0])
        assert Path(row["setup"]["ranker"]).name == expected
