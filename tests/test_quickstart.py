"""The README's main job on minimal settings: the shipped-model evaluation and the --small training smoke
run both write their outputs, print the bar, and are cached."""
import json
import time

import pytest

from effrag.quickstart import DATASETS, run_quickstart


def _check_rows(rows, wd, n):
    methods = {(r["method"], r.get("k")) for r in rows}
    for kind in ("bm25", "dense", "hybrid"):
        assert {(f"direct-r/{kind}", k) for k in range(1, 31)} <= methods
    assert {("efficientrag", c) for c in range(1, 11)} <= methods
    for r in rows:
        assert r["n"] == n and 0.0 <= r["recall"] <= 1.0
    er = sorted((r for r in rows if r["method"] == "efficientrag"), key=lambda r: r["k"])
    assert [r["recall"] for r in er] == sorted(r["recall"] for r in er)  # cutting a ranked pool deeper never loses
    assert all(r["avg_chunks"] <= r["k"] for r in er)
    assert json.loads((wd / "comparison.json").read_text()) == rows
    summary = json.loads((wd / "summary.json").read_text())
    for s in summary:
        mine = {r["k"]: r["recall"] for r in er if r["dataset"] == s["dataset"]}
        for chunks, depth in ((7, 20), (10, 30)):
            strongest = max(r["recall"] for r in rows if r["dataset"] == s["dataset"] and r["k"] == depth
                            and r["method"].startswith("direct-r/"))
            assert s[f"direct_r@{depth}"] == strongest
            assert s[f"bar{chunks}_met"] == (mine[chunks] >= strongest)
        assert len(s["forwards"]) == 3 and s["forwards"][0] > 0  # the loop read something
    md = (wd / "comparison.md").read_text()
    assert "strongest Direct-R@20" in md and "chose none of the shipped loop configs' final picks" in md
    assert "the grid's fixed values" in md and "loop structures" in md  # which choices did see them
    assert (wd / "recall_vs_chunks.png").stat().st_size > 0
    return summary


@pytest.mark.slow
def test_quickstart_small_trains_runs_and_caches(tmp_path):
    wd = tmp_path / "qs"
    kw = dict(workdir=wd, retriever="bm25", small=True, epochs=1.0, max_train_examples=24, limit=3,
              datasets=("hotpotqa",))
    rows = run_quickstart(**kw)
    assert (wd / "corpus.jsonl").stat().st_size > 0
    for f in ("labeler.jsonl", "filter.jsonl", "stats.json"):
        assert (wd / "synth" / "train" / f).is_file()
    for task in ("labeler", "filter", "ranker"):
        assert (wd / "models" / task / "last" / "effrag_config.json").is_file()
    _check_rows(rows, wd, 3)
    assert "smoke" in (wd / "comparison.md").read_text()

    t0 = time.time()
    again = run_quickstart(**kw)  # every stage cached: no training, no evaluation
    assert again == rows
    assert time.time() - t0 < 30


@pytest.mark.slow
def test_quickstart_evaluates_the_shipped_model(tmp_path):
    wd = tmp_path / "qs"
    rows = run_quickstart(workdir=wd, retriever="bm25", limit=4, datasets=("musique",))
    assert not (wd / "synth").exists() and not (wd / "models").exists()  # nothing trained
    (s,) = _check_rows(rows, wd, 4)
    assert s["dataset"] == "musique"
    assert "shipped system efficientrag-all" in (wd / "comparison.md").read_text()


def test_the_printed_table_fits_80_columns_one_line_per_dataset():
    import io

    from rich.console import Console

    from effrag.quickstart import comparison_table, terminal_table

    def item(ds, kind, margin):
        return {"dataset": ds, "n": 30, "direct_r@20": 0.883, "direct_r@20_retriever": kind, "direct_r@30": 0.933,
                "direct_r@30_retriever": kind, "efficientrag@7": 0.883 + margin, "efficientrag@10": 0.933 + margin,
                "bar7_margin": margin, "bar10_margin": margin, "forwards": [4.2, 33.4, 1.1], "retriever": "hybrid"}

    summary = [item("hotpotqa", "bm25", 0.017), item("2wikimqa", "hybrid", 0.075), item("musique", "hybrid", -0.05)]
    t = comparison_table(summary, "shipped system efficientrag-all")
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(terminal_table(t, console.width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for s in summary:  # each dataset on one line, with every figure on it
        (row,) = [line for line in lines if s["dataset"] in line]
        assert "88.3 hybrid" in row or "88.3 bm25" in row
        assert f"{100 * (0.933 + s['bar10_margin']):.1f} {100 * s['bar10_margin']:+.1f}" in row and "4+33" in row
    assert t["short_title"].endswith("; 30 questions per dataset")
    assert t["columns"][1] == "questions" and all(r[1] == "30" for r in t["rows"])  # the .md table keeps them


def test_the_bundled_dev_questions_chose_no_shipped_loop_config():
    """The caption's claim, checked against what chose the configs: each shipped loop config was chosen on the dev
    questions its committed evidence holds (reports/efficientrag/crossfit/evidence), and none of them is bundled."""
    import json
    from pathlib import Path

    from effrag.data import load_questions, sample_path
    from effrag.pretrained import pretrained_path
    from effrag.tuning.evidence import read_evidence

    root = Path(__file__).resolve().parents[1]
    system = Path(pretrained_path("efficientrag-all"))
    for ds in ("hotpotqa", "2wikimqa", "musique"):
        bundled = {q.id for q in load_questions(sample_path(ds, "dev"))}
        ev = read_evidence(root / "reports" / "efficientrag" / "e5-small-late" / "evidence" / f"{ds}.json.gz")
        chose = set().union(*(set(by_q) for by_k in ev["direct_r_per_question"].values() for by_q in by_k.values()))
        assert chose and not chose & bundled
        cfg = json.loads((system / f"loop-{ds}.json").read_text())
        assert cfg["chosen_on"]["n"][ds] == len(chose) and "but the bundled sample's" in cfg["chosen_on"]["questions"]
        assert cfg["crossfit"][ds]["n"] == len(chose)


def test_every_shipped_loop_config_is_the_pick_of_its_committed_evidence(tmp_path):
    """The shipped rule (recall first; loop.json where a dataset's own rule does not beat it cross-fitted), run on the
    committed evidence with the bundled questions left out, makes the four shipped files: options, ranker, retriever,
    encoder and cross-fitted figures. A pick changed by hand, or evidence that no longer makes it, fails here."""
    from pathlib import Path

    from effrag.data import sample_question_ids
    from effrag.pretrained import pretrained_path
    from effrag.tuning.evidence import read_evidence
    from effrag.tuning.loop_configs import write_loop_configs

    root = Path(__file__).resolve().parents[1]
    evidence = {ds: read_evidence(root / "reports" / "efficientrag" / "e5-small-late" / "evidence" / f"{ds}.json.gz")
                for ds in ("hotpotqa", "2wikimqa", "musique")}
    tunes = {ds: e["rows"] for ds, e in evidence.items()}
    report = write_loop_configs(tunes, tmp_path, exclude=sample_question_ids(tunes), fall_back=True,
                                ranker_factors={ds: e["ranker_factor"] for ds, e in evidence.items()})
    system = Path(pretrained_path("efficientrag-all"))
    for name in ("loop.json", *(f"loop-{ds}.json" for ds in tunes)):
        shipped, rebuilt = (json.loads((folder / name).read_text()) for folder in (system, tmp_path))
        for field in ("config", "retriever", "encoder", "ranker", "crossfit", "in_sample_recall"):
            assert shipped.get(field) == rebuilt.get(field), (name, field)
        assert shipped["chosen_on"]["rule"] == rebuilt["chosen_on"]["rule"]
    assert report["per_dataset"]["2wikimqa"]["ships"] == "loop.json"  # as the card and the README say


def test_every_shipped_loop_config_records_the_set_ranker_decision_of_its_committed_scores():
    """Issue #70: the set-wise ranker's step (scripts/train_set_ranker.sh) decided, per loop config, whether it
    reorders the pool (``set_ranker_top``); rebuilt from the committed per-question scores with the bundled questions
    left out, the decision and its figures are what each shipped file records, and a config carries
    ``set_ranker_top`` exactly when the decision ships the model."""
    import gzip
    from pathlib import Path

    from effrag.data import sample_question_ids
    from effrag.pretrained import pretrained_path
    from effrag.tuning.set_ranker import apply_decision, evaluate_unit, group_rows

    root = Path(__file__).resolve().parents[1]
    evidence = root / "reports" / "efficientrag" / "set-ranker" / "scores.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(evidence, "rt")]
    groups = group_rows(rows, sample_question_ids(("hotpotqa", "2wikimqa", "musique")))
    joint = evaluate_unit(groups, ["hotpotqa-dev-all", "2wikimqa-dev-all", "musique-dev-all"])
    own = {ds: evaluate_unit(groups, [f"{ds}-dev-own"]) for ds in ("hotpotqa", "musique")}
    system = Path(pretrained_path("efficientrag-all"))
    report = "reports/efficientrag/set-ranker/decisions.md"
    for name, decision in (("loop.json", joint), ("loop-2wikimqa.json", joint), ("loop-hotpotqa.json", own["hotpotqa"]),
                           ("loop-musique.json", own["musique"])):
        shipped = json.loads((system / name).read_text())
        rebuilt = apply_decision(shipped, decision, report)
        assert shipped["set_ranker"] == json.loads(json.dumps(rebuilt["set_ranker"])), name
        assert shipped["config"].get("set_ranker_top", 0) == decision["top"], name
    assert (system / "set-ranker" / "set_ranker.json").is_file()


def test_the_committed_quickstart_output_is_what_the_command_prints_of_its_figures():
    """reports/quickstart/ keeps one run of the command: its summary.json holds the figures, which reports/headline.json
    names and the README's copy of the table renders from (tests/test_headline.py). The printed table and
    comparison.md beside it are what the command makes of those figures now, so a change to what it prints fails
    here until it is rerun."""
    from pathlib import Path

    from effrag.data import load_questions, sample_path
    from effrag.headline import quickstart_printed, quickstart_summary
    from effrag.quickstart import SHIPPED, comparison_markdown, comparison_table

    root = Path(__file__).resolve().parents[1]
    spec = json.loads((root / "reports" / "headline.json").read_text())["quickstart"]
    summary = quickstart_summary({"quickstart": spec}, root)
    assert (root / spec["printed"]).read_text() == quickstart_printed(summary)
    folder = (root / spec["evidence"]).parent
    assert (folder / "comparison.md").read_text() == comparison_markdown(comparison_table(summary, SHIPPED))
    assert [s["dataset"] for s in summary] == list(DATASETS)
    for s in summary:  # every bundled dev question of each dataset
        assert s["n"] == len(load_questions(sample_path(s["dataset"], "dev")))


def test_the_committed_quickstart_output_ran_on_the_installed_system_and_sample():
    """The committed figures are the command's expectations only for the shipped system and sample they ran on:
    reports/headline.json records a digest of both, and a retrained or retuned system fails here until the quickstart
    is rerun and its output committed."""
    from pathlib import Path

    from effrag.headline import quickstart_inputs_stale

    root = Path(__file__).resolve().parents[1]
    spec = json.loads((root / "reports" / "headline.json").read_text())
    assert quickstart_inputs_stale(spec, root) is None
