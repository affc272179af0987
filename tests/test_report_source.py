"""Figures from committed code only: a report script checks the tree before its work
(``effrag.provenance.report_source``), refuses one with uncommitted changes unless ``--allow-dirty``
(``effrag.cli_args.add_source_args``), and then writes the diff beside its report.

The function is tested on a real temporary git repository; the scripts are checked from their source: every script
under ``scripts/`` and ``scripts/probes/`` is either a report script that checks the tree before its expensive work, or left out with a
reason, so a new report script without the check fails here.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

import pytest

from effrag.cli_args import ALLOW_DIRTY_ENV, add_source_args
from effrag.provenance import committed_source, provenance, report_source, source_commit, write_report

ROOT = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false",
                           *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    (r / "code.py").write_text("ANSWER = 41\n")
    git(r, "add", "code.py")
    git(r, "commit", "-q", "-m", "first")
    return r


def test_a_clean_tree_gives_the_hash(repo, tmp_path):
    head = git(repo, "rev-parse", "--short", "HEAD")
    out = tmp_path / "report"
    assert report_source(out, repo=repo) == head == source_commit(repo) == committed_source(repo=repo)
    assert not out.exists()  # nothing written for a clean tree
    (repo / "untracked.txt").write_text("not the code\n")  # an untracked file is no change to the code
    assert report_source(out, repo=repo) == head


def test_what_runs_write_and_documents_leave_the_code_committed(repo, tmp_path):
    """The recipe rewrites tracked checkpoint cards and loop configs, and a report its README: the scripts it runs
    after that still measure committed code. A change to the code itself still counts."""
    for rel in ("checkpoints/efficientrag-all/loop.json", "reports/x/report.md", "effrag/pretrained/s/loop.json",
                "docs/guide.md", "README.md", "sub/NOTES.md"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("v1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "outputs")
    head = git(repo, "rev-parse", "--short", "HEAD")
    for rel in ("checkpoints/efficientrag-all/loop.json", "reports/x/report.md", "effrag/pretrained/s/loop.json",
                "docs/guide.md", "README.md", "sub/NOTES.md"):
        (repo / rel).write_text("v2\n")
    assert source_commit(repo) == head
    (repo / "code.py").write_text("ANSWER = 43\n")
    assert source_commit(repo) == f"{head} + uncommitted changes"
    assert report_source(tmp_path / "out", True, repo=repo).endswith("(uncommitted.diff)")
    diff = (tmp_path / "out" / "uncommitted.diff").read_text()
    assert "ANSWER = 43" in diff and "loop.json" not in diff and "README.md" not in diff  # the code's diff only


def test_a_dirty_tree_is_refused_in_one_line(repo, tmp_path):
    head = git(repo, "rev-parse", "--short", "HEAD")
    (repo / "code.py").write_text("ANSWER = 42\n")
    out = tmp_path / "report"
    for check in (lambda: report_source(out, repo=repo), lambda: committed_source(repo=repo)):
        with pytest.raises(SystemExit) as e:
            check()
        message = str(e.value.code)
        assert message == f"the tree has uncommitted changes ({head} + uncommitted changes): commit first, or --allow-dirty"
        assert "\n" not in message
    assert not out.exists()  # refused before anything was written


def test_allowed_the_diff_is_written_beside_the_report_then_removed_by_a_clean_run(repo, tmp_path):
    head = git(repo, "rev-parse", "--short", "HEAD")
    elsewhere = tmp_path / "data" / "dev.jsonl"  # an absolute path of this machine in the change
    (repo / "code.py").write_text(f"ANSWER = 42\nDATA = '{elsewhere}'\n")
    out = tmp_path / "report"
    assert report_source(out, True, repo=repo) == f"{head} + uncommitted changes (uncommitted.diff)"
    diff = (out / "uncommitted.diff").read_text()
    assert "-ANSWER = 41" in diff and "+ANSWER = 42" in diff and "a/code.py" in diff
    assert str(tmp_path) not in diff and "<tmp>/" in diff  # paths made portable
    assert committed_source(True, repo=repo) == f"{head} + uncommitted changes"  # no folder: no diff
    # a report written as a file: the diff named after it
    assert report_source(out, True, name="pareto.uncommitted.diff", repo=repo).endswith("(pareto.uncommitted.diff)")
    assert (out / "pareto.uncommitted.diff").read_text() == diff
    git(repo, "commit", "-q", "-am", "second")
    assert report_source(out, repo=repo) == git(repo, "rev-parse", "--short", "HEAD")
    assert not (out / "uncommitted.diff").exists()  # a clean rerun leaves no stale diff beside its report


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert report_source(tmp_path / "out", repo=tmp_path) == "unknown" == source_commit(tmp_path)


def test_every_report_records_its_commit(tmp_path):
    assert provenance()["commit"] == source_commit()
    assert provenance(commit="abc1234 + uncommitted changes (uncommitted.diff)")["commit"].startswith("abc1234")
    import json

    write_report(tmp_path, "# r\n", {"rows": []}, commit="abc1234")
    assert json.loads((tmp_path / "report.json").read_text())["commit"] == "abc1234"
    write_report(tmp_path, "# r\n", {"rows": []})
    assert json.loads((tmp_path / "report.json").read_text())["commit"] == source_commit()


def test_allow_dirty_is_off_unless_asked(monkeypatch):
    def parse(argv):
        p = argparse.ArgumentParser()
        add_source_args(p)
        return p.parse_args(argv).allow_dirty
    monkeypatch.delenv(ALLOW_DIRTY_ENV, raising=False)
    assert parse([]) is False and parse(["--allow-dirty"]) is True
    monkeypatch.setenv(ALLOW_DIRTY_ENV, "1")  # how tests/helpers.run_script runs the scripts
    assert parse([]) is True
    monkeypatch.setenv(ALLOW_DIRTY_ENV, "0")
    assert parse([]) is False


# ---------------------------------------------------------------------- which scripts check the tree
# every script that writes a figure or report file (into reports/, or evidence that reports commit)
REPORT_SCRIPTS = {
    "bench_direct_r", "bench_efficientrag", "bench_index_cost", "bench_irrr", "bench_labeler_backbones", "bench_llm",
    "bench_loop_cost", "bench_methods", "bench_qa", "bench_scale", "bench_training_data", "bench_vector_store",
    "codec_recall", "efficientrag_ablation", "efficientrag_misses", "efficientrag_report", "eval_reader",
    "irrr_report", "labeler_breakdown", "late_codec_quality", "load_test", "loop_cost_pareto", "probe_pool_ranking",
    "profile_loop", "set_ranker", "transfer_efficientrag", "tune_efficientrag", "tune_irrr", "tune_reader",
    "verify_e5",
}
LEFT_OUT = {
    "build_reader_vote": "builds a checkpoint folder from trained members; measures nothing",
    "compare_systems": "compares the figures two system folders already record; writes beside a checkpoint",
    "export_pretrained": "exports checkpoints into the package",
    "make_sample": "cuts the bundled sample out of the data files",
    "paired_recall": "prints a comparison of two runs; writes no file",
    "portable_paths": "rewrites absolute paths in files",
    "render_headline": "renders the README's tables and the shipped card from committed reports; measures nothing",
    "summarize_tuning": "prints a table of a tuning folder; writes no file",
    "synthesize_llm_sample": "synthesises training records under runs/",
    "train_models": "trains and installs checkpoints; its reader step runs tune_reader.py with --allow-dirty",
}
CHECKS = {"report_source", "committed_source"}
# calls that load models or data, or run them: none may come before the check in the function that makes it
EXPENSIVE = {"build", "from_args", "from_pretrained", "load_model", "load_models", "load_reader",
             "load_reader_checkpoint", "open_system", "build_pipeline", "load_llm", "run_grid", "measure", "compare",
             "evaluate", "tune_irrr", "run", "dev_logits", "run_clients", "spawn_server", "make_data", "compare_systems",
             "read_evidence", "read_rows", "crossfit", "part_pooled", "part_synthetic", "part_e2e"}


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def check_problems(source: str) -> list[str]:
    """Why a report script's source does not check the tree before its work (empty: it does)."""
    tree = ast.parse(source)
    problems = []
    if "add_source_args(" not in source and '"--allow-dirty"' not in source:
        problems.append("no --allow-dirty (effrag.cli_args.add_source_args)")
    checks = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n) in CHECKS]
    if not checks:
        problems.append("no report_source() call")
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for call in checks:
        inside = [f for f in functions if f.lineno <= call.lineno <= f.end_lineno]
        if not inside:
            continue
        func = min(inside, key=lambda f: f.end_lineno - f.lineno)
        # a branch that returns before the check is another mode (a child process measuring one size, a worker)
        exits = [(n.lineno, n.end_lineno) for n in ast.walk(func) if isinstance(n, ast.If) and n.end_lineno < call.lineno
                 and n.body and isinstance(n.body[-1], ast.Return)]
        early = sorted({f"{_name(n)}() at line {n.lineno}" for n in ast.walk(func) if isinstance(n, ast.Call)
                        and _name(n) in EXPENSIVE and n.lineno < call.lineno
                        and not any(a <= n.lineno <= b for a, b in exits)})
        if early:
            problems.append(f"{func.name}: {', '.join(early)} before the check at line {call.lineno}")
    return problems


def test_the_static_check_finds_a_script_that_checks_too_late():
    late = ("import argparse\nfrom effrag.cli_args import add_source_args\n"
            "def main(argv=None):\n    p = argparse.ArgumentParser()\n    add_source_args(p)\n"
            "    args = p.parse_args(argv)\n    run = RunSetup.build(args.questions)\n"
            "    commit = report_source(args.output, args.allow_dirty)\n")
    assert check_problems(late) == ["main: build() at line 7 before the check at line 8"]
    assert check_problems("def main():\n    write_report('out', '', {})\n") == [
        "no --allow-dirty (effrag.cli_args.add_source_args)", "no report_source() call"]
    early = late.replace("    run = RunSetup.build(args.questions)\n", "") + "    run = RunSetup.build(args.questions)\n"
    assert check_problems(early) == []
    child = early.replace("    args = p.parse_args(argv)\n", "    args = p.parse_args(argv)\n    if args.one:\n"
                          "        print(measure(args.one))\n        return\n")
    assert check_problems(child) == []  # the child process of a bench that checked the tree


def test_every_report_script_checks_the_tree_before_its_work():
    scripts = {f.stem: f for f in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "scripts" / "probes").glob("*.py")]}
    assert set(REPORT_SCRIPTS) | set(LEFT_OUT) <= set(scripts), "a listed script that is gone"
    unclassified = sorted(set(scripts) - REPORT_SCRIPTS - set(LEFT_OUT))
    assert not unclassified, (f"{unclassified}: a script that writes a report checks the tree first (call "
                              "effrag.provenance.report_source after parsing, with effrag.cli_args.add_source_args), "
                              "and is listed in REPORT_SCRIPTS; any other is listed in LEFT_OUT with why")
    assert not REPORT_SCRIPTS & set(LEFT_OUT)
    problems = {name: p for name in sorted(REPORT_SCRIPTS & set(scripts))
                if (p := check_problems(scripts[name].read_text(encoding="utf-8")))}
    assert not problems, problems
    writers = sorted(n for n in set(LEFT_OUT) & set(scripts) if "write_report(" in scripts[n].read_text(encoding="utf-8"))
    assert not writers, f"{writers} write a report: they check the tree (REPORT_SCRIPTS)"


def test_a_report_records_no_path_of_this_machine(tmp_path):
    """A report's options and command, as committed, name paths relative to the repository or under a named root."""
    import json

    out = tmp_path / "report"
    write_report(out, "# r\n", {"rows": []}, args=argparse.Namespace(output=out, n=3), argv=["--output", str(out)],
                 commit="abc1234")
    data = json.loads((out / "report.json").read_text())
    assert str(tmp_path) not in json.dumps(data)
    assert data["config"]["output"].startswith("<tmp>/") and data["command"].endswith(data["config"]["output"])
    assert data["config"]["n"] == 3 and data["commit"] == "abc1234"
