"""The effrag CLI on the bundled sample: corpus build, index build, eval, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from effrag.cli import main
from effrag.data import Corpus, build_corpus, sample_path

HOTPOT_TRAIN, HOTPOT_DEV = sample_path("hotpotqa", "train"), sample_path("hotpotqa", "dev")


def run(argv, capsys):
    """(exit code, stdout, stderr) of ``effrag argv`` run in-process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own exits (--help, usage errors)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """corpus.jsonl and a BM25 index of the HotpotQA sample, built through the CLI."""
    d = tmp_path_factory.mktemp("cli")
    assert main(["corpus", "build", "--inputs", str(HOTPOT_TRAIN), str(HOTPOT_DEV),
                 "--output", str(d / "corpus.jsonl")]) == 0
    assert main(["index", "build", "--corpus", str(d / "corpus.jsonl"), "--retriever", "bm25",
                 "--output", str(d / "bm25")]) == 0
    return d


def test_corpus_build_pools_contexts_once(built):
    corpus = Corpus.from_jsonl(built / "corpus.jsonl")
    assert corpus.fingerprint() == build_corpus([HOTPOT_TRAIN, HOTPOT_DEV]).fingerprint()
    meta = json.loads((built / "bm25" / "index_meta.json").read_text())
    assert meta["kind"] == "bm25" and meta["corpus"]["size"] == len(corpus)


def test_eval_direct_r_bm25_writes_outputs(built, tmp_path, capsys):
    code, out, err = run(["eval", "--method", "direct-r", "--questions", HOTPOT_DEV, "--index", built / "bm25",
                          "--retriever", "bm25", "--k", 10, "--k", 2, "--limit", 5, "--output", tmp_path], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(len(r["retrieved"]) == 10 and len(r["gold"]) == 2 for r in rows)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [m["k"] for m in metrics] == [2, 10]
    for m in metrics:
        assert m["method"] == "direct-r" and m["dataset"] == "hotpotqa" and m["n"] == 5
        assert m["retriever"] == "bm25" and 0 <= m["recall"] <= 1 and m["avg_chunks"] == m["k"]
        assert m["latency_s"] > 0
    assert metrics[1]["recall"] >= metrics[0]["recall"] > 0
    assert (tmp_path / "metrics.md").read_text().count("| direct-r | hotpotqa |") == 2
    assert "| direct-r | hotpotqa | bm25 | 10 | 5 |" in out
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["run"]["k"] == [2, 10] and config["run"]["limit"] == 5 and "bm25s" in config["versions"]


def test_eval_corpus_from_builds_then_reuses_cached_index(tmp_path, capsys):
    args = ["eval", "--method", "direct-r", "--questions", HOTPOT_DEV, "--corpus-from", HOTPOT_TRAIN,
            "--retriever", "bm25", "--k", 5, "--limit", 3, "--cache-dir", tmp_path / "cache"]
    assert run(args + ["--output", tmp_path / "a"], capsys)[0] == 0
    [entry] = list((tmp_path / "cache").iterdir())
    stamp = (entry / "index_meta.json").stat().st_mtime_ns
    assert run(args + ["--output", tmp_path / "b"], capsys)[0] == 0
    assert (entry / "index_meta.json").stat().st_mtime_ns == stamp
    assert (json.loads((tmp_path / "a" / "metrics.json").read_text())[0]["recall"]
            == json.loads((tmp_path / "b" / "metrics.json").read_text())[0]["recall"])


def test_index_build_dense_with_options(tmp_path, capsys):
    corpus = Corpus.from_jsonl(_tiny_corpus(tmp_path))
    code, out, err = run(["index", "build", "--corpus", tmp_path / "tiny.jsonl", "--retriever", "dense",
                          "--index-type", "hnsw", "--bf16", "--output", tmp_path / "idx"], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "idx" / "index_meta.json").read_text())
    assert meta["options"]["index_type"] == "hnsw" and meta["encoder"]["bf16"] is True
    assert meta["corpus"]["fingerprint"] == corpus.fingerprint()
    assert not (tmp_path / "idx" / "emb_shards").exists()


def _tiny_corpus(tmp_path):
    rows = [{"id": f"p{i}", "title": t, "text": x} for i, (t, x) in enumerate([
        ("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany."),
        ("Cat", "The cat is a small domestic mammal.")])]
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bad_cases(tmp):
    unknown = tmp / "unknown.jsonl"
    unknown.write_text('{"foo": 1, "bar": 2}\n')
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    bamboogle = sample_path("bamboogle", "dev")
    ev = ["eval", "--questions", HOTPOT_DEV, "--retriever", "bm25", "--output", tmp / "out"]
    return {
        "missing questions file": ["eval", "--questions", tmp / "nope.jsonl", "--corpus-from", HOTPOT_TRAIN,
                                   "--retriever", "bm25", "--output", tmp / "o"],
        "unknown dataset format": ["corpus", "build", "--inputs", unknown, "--output", tmp / "c.jsonl"],
        "empty corpus": ["corpus", "build", "--inputs", bamboogle, "--output", tmp / "c.jsonl"],
        "empty corpus file": ["index", "build", "--corpus", empty, "--retriever", "bm25", "--output", tmp / "i"],
        "k zero": ev + ["--corpus-from", HOTPOT_TRAIN, "--k", "0"],
        "k not a number": ev + ["--corpus-from", HOTPOT_TRAIN, "--k", "ten"],
        "unknown method": ev + ["--corpus-from", HOTPOT_TRAIN, "--method", "oracle-magic"],
        "no corpus": ev,
        "missing index": ev + ["--index", tmp / "no-index"],
        "unknown dataset name": ev + ["--corpus-from", HOTPOT_TRAIN, "--dataset", "squad"],
        "missing subcommand": ["index"],
    }


BAD_CASES = ["missing questions file", "unknown dataset format", "empty corpus", "empty corpus file", "k zero",
             "k not a number", "unknown method", "no corpus", "missing index", "unknown dataset name",
             "missing subcommand"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_exits_2_with_one_line(case, tmp_path, capsys):
    code, out, err = run(_bad_cases(tmp_path)[case], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err


def test_index_of_another_corpus_is_refused(built, tmp_path, capsys):
    code, _, err = run(["eval", "--questions", HOTPOT_DEV, "--index", built / "bm25",
                        "--corpus", _tiny_corpus(tmp_path), "--output", tmp_path / "o"], capsys)
    assert code == 2 and "different corpus" in err and len(err.strip().splitlines()) == 1


def test_console_entry_point_reports_errors_on_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "effrag.cli", "eval", "--questions", str(tmp_path / "x.jsonl"),
                           "--corpus-from", str(HOTPOT_TRAIN), "--retriever", "bm25", "--output", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"effrag: error: dataset file not found: {tmp_path / 'x.jsonl'}"


def test_an_output_folder_that_is_an_existing_file_is_a_usage_error(tmp_path, capsys):
    afile = tmp_path / "taken"
    afile.write_text("keep me")
    for argv in (["synthesize", "--inputs", str(HOTPOT_TRAIN), "--output", str(afile)],
                 ["index", "build", "--corpus", str(HOTPOT_TRAIN), "--retriever", "bm25", "--output", str(afile)],
                 ["irrr-data", "--inputs", str(HOTPOT_TRAIN), "--output", str(afile)]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"{afile} is an existing file; give a folder path" in err and "Traceback" not in err
    assert afile.read_text() == "keep me"


def test_a_bad_loop_option_fails_before_the_corpus_is_read(tmp_path, capsys, monkeypatch):
    """EfficientRAG's options are checked before any corpus or index is built: the error is at once."""
    from effrag import experiment

    def no_setup(*a, **kw):
        raise AssertionError("the run setup was built before the options were checked")

    monkeypatch.setattr(experiment.RunSetup, "from_args", classmethod(no_setup))
    code, _, err = run(["eval", "--method", "efficientrag", "--labeler", tmp_path, "--filter", tmp_path,
                        "--questions", HOTPOT_DEV, "--corpus-from", HOTPOT_TRAIN, "--retriever", "bm25",
                        "--pool-order", "hop", "--requery-weight", "1", "--output", tmp_path / "out"], capsys)
    assert code == 2 and "requery_weight needs pool_order fused or fused_logit" in err
    code, _, err = run(["eval", "--method", "efficientrag", "--questions", HOTPOT_DEV, "--corpus-from", HOTPOT_TRAIN,
                        "--retriever", "bm25", "--output", tmp_path / "out"], capsys)
    assert code == 2 and "needs --labeler DIR and --filter DIR" in err
