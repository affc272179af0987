"""``effrag ranker-data --from-loop``: ranker groups from the loop's own searches (data_synthesis/loop_groups.py).

Real tiny Labeler and Filter (tests/conftest.py ``tiny_efficientrag_dirs``) as a system folder, a real BM25 index over
the bundled HotpotQA train sample, a real kill -9 and a real torn write for the resume.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from effrag.data import sample_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAIN = str(sample_path("hotpotqa", "train"))
LOOP = {"max_hops": 2, "first_hop_k": 5, "hop_k": 3, "tag_threshold": 0.0, "token_threshold": 0.3,
        "query_mode": "per_chunk", "max_branches": 2, "pool_order": "rank", "rank_query": "info"}
ARGS = ["--retriever", "bm25", "--depth", "4", "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def system(tiny_efficientrag_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("loop_groups") / "system"
    for name in ("labeler", "filter"):
        shutil.copytree(tiny_efficientrag_dirs[name], root / name)
    (root / "loop.json").write_text(json.dumps({"config": LOOP}))
    return root


@pytest.fixture(scope="module")
def made(system):
    from effrag.cli import main

    out = system.parent / "groups"
    assert main(["ranker-data", "--from-loop", str(system), "--inputs", TRAIN, "--output", str(out), *ARGS]) == 0
    return out


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_each_search_of_the_loop_is_a_group_of_its_top_hits_read_as_the_ranker_reads_them(system, made):
    from effrag.setup import RunSetup
    from effrag.text import words

    groups, info = _lines(made / "ranker.jsonl"), json.loads((made / "ranker_data.json").read_text())
    setup = RunSetup.build(TRAIN, corpus_from=[TRAIN], retriever="bm25")
    questions = {q.id: q for q in setup.questions}
    assert info["questions"] == len(questions) == 60 and info["groups"] == len(groups) > 60
    assert info["searches"] == info["groups"] + info["no_gold"] + info["no_negative"]
    assert info["pairs"] == sum(len(g["candidates"]) for g in groups)
    assert {g["hop"] for g in groups} == {0, 1}  # every chunk continues (tag_threshold 0): the loop's own queries
    for g in groups:
        q = questions[g["qid"]]
        hits = setup.retriever.search([g["search_query"]], 4)[0]
        titles = {p.title.casefold() for p in q.gold}
        want = [h.id for h in hits if h.id in q.gold_ids or h.title.casefold() not in titles]
        assert [c["chunk_id"] for c in g["candidates"]] == want  # the top hits, gold copies left out
        assert [c["gold"] for c in g["candidates"]] == [int(c["chunk_id"] in q.gold_ids) for c in g["candidates"]]
        assert any(c["gold"] for c in g["candidates"]) and len(g["candidates"]) >= 2
        if g["hop"] == 0:
            assert g["query"] == g["search_query"] == q.question
        else:  # rank_query info: the ranker reads the next query's Filter input, "<query> Info: <kept words>",
            # whose kept words are the query searched
            assert "Info:" in g["query"] and g["search_query"] != q.question
            kept = lambda text: {w for w in words(text) if w.isalnum()}  # noqa: E731 (punctuation re-joins)
            assert kept(g["search_query"]) <= kept(g["query"])
    # the groups train a ranker as they are (the task's record check)
    from effrag.training.tasks.ranker import check_ranker_record

    for n, g in enumerate(groups, 1):
        check_ranker_record(g, f"ranker.jsonl:{n}")


def test_a_finished_output_is_reused_and_another_loop_config_is_not(system, made, capsys):
    from helpers import run_cli

    before = (made / "ranker.jsonl").stat().st_mtime_ns
    code, out, _ = run_cli(["ranker-data", "--from-loop", system, "--inputs", TRAIN, "--output", made,
                            *ARGS[:-1]], capsys)
    assert code == 0 and "reused" in out and (made / "ranker.jsonl").stat().st_mtime_ns == before
    other = system.parent / "one_hop.json"
    other.write_text(json.dumps({"config": {**LOOP, "max_hops": 1}}))
    code, _, _ = run_cli(["ranker-data", "--from-loop", system, "--loop-config", other, "--inputs", TRAIN,
                          "--output", system.parent / "one_hop", *ARGS], capsys)
    assert code == 0 and {g["hop"] for g in _lines(system.parent / "one_hop" / "ranker.jsonl")} == {0}


def test_kill_9_and_a_torn_write_resume_to_the_uninterrupted_output(system, made, tmp_path):
    from helpers import kill_9_when

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "data_synthesis.cli", "ranker-data", "--from-loop", str(system), "--inputs", TRAIN,
           "--output", str(out), *ARGS]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    progress = out / "loop_groups.progress.json"

    def some_batches_written() -> bool:  # a few batches, before the last
        try:
            return json.loads(progress.read_text())["questions"] >= 8
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False

    kill_9_when(proc, some_batches_written)
    assert not (out / "ranker.jsonl").exists()
    done = json.loads(progress.read_text())["questions"]
    assert 8 <= done < 60
    with (out / "ranker.jsonl.partial").open("ab") as f:  # a write torn by the kill: half a record past the offset
        f.write(b'{"qid": "5a7276705542991f9a20c482", "dataset": "hotpotqa", "hop": 1, "query": "torn')
    from effrag.cli import main

    assert main(["ranker-data", "--from-loop", str(system), "--inputs", TRAIN, "--output", str(out), *ARGS]) == 0
    assert (out / "ranker.jsonl").read_bytes() == (made / "ranker.jsonl").read_bytes()
    assert json.loads((out / "ranker_data.json").read_text()) == json.loads((made / "ranker_data.json").read_text())
    assert not progress.exists() and not (out / "ranker.jsonl.partial").exists()


def test_ranker_data_needs_one_source_and_loop_config_goes_with_from_loop(system, tmp_path, capsys):
    from helpers import run_cli

    code, _, err = run_cli(["ranker-data", "--inputs", TRAIN, "--output", tmp_path / "o"], capsys)
    assert code == 2 and "one of the arguments --synth --from-loop is required" in err
    code, _, err = run_cli(["ranker-data", "--synth", tmp_path, "--loop-config", tmp_path / "x.json", "--inputs",
                            TRAIN, "--output", tmp_path / "o"], capsys)
    assert code == 2 and "--loop-config goes with --from-loop" in err
    code, _, err = run_cli(["ranker-data", "--from-loop", tmp_path, "--inputs", TRAIN, "--output", tmp_path / "o"],
                           capsys)
    assert code == 2 and "not an EfficientRAG system folder" in err


def _stopped(system, out, limit: int, batches: int, monkeypatch):
    """A run of the first ``limit`` questions stopped after ``batches`` batches (Ctrl-C in the loop): its partial
    output and progress record as the real code left them."""
    from data_synthesis.loop_groups import write_loop_groups
    from effrag.pipelines.efficientrag import EfficientRAGLoop

    run_states, done = EfficientRAGLoop.run_states, []

    def stop_after(self, questions):
        if len(done) == batches:
            raise KeyboardInterrupt
        done.append(len(questions))
        return run_states(self, questions)

    with monkeypatch.context() as m:
        m.setattr(EfficientRAGLoop, "run_states", stop_after)
        with pytest.raises(KeyboardInterrupt):
            write_loop_groups(system, [TRAIN], out, retriever="bm25", depth=4, batch_size=4, limit=limit,
                              show_progress=False)
    return json.loads((out / "loop_groups.progress.json").read_text())


@pytest.mark.parametrize("cut", ["5000 bytes short", "before the first batch end"])
def test_a_partial_shorter_than_its_progress_is_never_padded(system, made, tmp_path, monkeypatch, caplog, cut):
    """An unclean shutdown can leave ranker.jsonl.partial shorter than the offset its progress records (flushed, not
    on disk, when the progress was replaced). The resume used to truncate() it to that offset, which extends a
    shorter file with NUL bytes: exit 0 and a ranker.jsonl line of 5,000 NULs. Now it resumes after the last
    recorded batch the file still holds whole, or starts again, saying so in one line; the output is the
    uninterrupted one."""
    from data_synthesis.loop_groups import write_loop_groups

    out, limit = tmp_path / "cut", 24
    progress = _stopped(system, out, limit, batches=4 if cut == "5000 bytes short" else 2, monkeypatch=monkeypatch)
    partial = out / "ranker.jsonl.partial"
    assert progress["questions"] in (8, 16) and partial.stat().st_size == progress["bytes"]
    os.truncate(partial, progress["bytes"] - 5000 if cut == "5000 bytes short" else 10)
    with caplog.at_level(logging.WARNING, logger="data_synthesis.loop_groups"):
        info = write_loop_groups(system, [TRAIN], out, retriever="bm25", depth=4, batch_size=4, limit=limit,
                                 show_progress=False)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "data_synthesis.loop_groups"]
    assert str(partial) in warning and f"shorter than the {progress['bytes']} its progress recorded" in warning
    if cut == "5000 bytes short":
        assert "resuming after question" in warning and f"instead of {progress['questions']}" in warning
    else:
        assert "holds none of the recorded batches whole: starting this output again" in warning
    got = (out / "ranker.jsonl").read_bytes()
    first = {json.loads(x)["qid"] for x in got.splitlines()}
    want = [x for x in (made / "ranker.jsonl").read_bytes().splitlines(keepends=True) if json.loads(x)["qid"] in first]
    assert b"\0" not in got and got == b"".join(want)  # the uninterrupted run's groups of those questions, in order
    assert info["questions"] == limit and info["groups"] == len(want)


@pytest.mark.parametrize("name", ["loop_groups.progress.json", "ranker_data.json"])
def test_a_torn_state_file_is_one_line_naming_it(system, made, tmp_path, monkeypatch, capsys, name):
    """A torn progress record (of a partial output) or ranker_data.json (of a finished one) ended in
    `effrag: error: Expecting value: line 1 column 10`, naming no file."""
    from helpers import run_cli

    out = tmp_path / "torn"
    if name == "ranker_data.json":
        shutil.copytree(made, out)
    else:
        _stopped(system, out, 8, batches=1, monkeypatch=monkeypatch)
    os.truncate(out / name, 9)
    code, _, err = run_cli(["ranker-data", "--from-loop", system, "--inputs", TRAIN, "--output", out, *ARGS], capsys)
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.startswith("effrag:")]
    assert code == 2 and "Traceback" not in err and len(lines) == 1
    assert lines[0].startswith(f"effrag: error: {out / name}: not a readable state file (torn or damaged JSON: ")
