"""The effrag CLI on the bundled sample: corpus build, index build, eval, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run_cli as run

from effrag.cli import main
from effrag.data import Corpus, build_corpus, sample_path

HOTPOT_TRAIN, HOTPOT_DEV = sample_path("hotpotqa", "train"), sample_path("hotpotqa", "dev")


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
    ev = ["eval", "--method", "direct-r", "--questions", HOTPOT_DEV, "--retriever", "bm25", "--output", tmp / "out"]
    return {
        "missing questions file": ["eval", "--method", "direct-r", "--questions", tmp / "nope.jsonl", "--corpus-from", HOTPOT_TRAIN,
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
    code, _, err = run(["eval", "--method", "direct-r", "--questions", HOTPOT_DEV, "--index", built / "bm25",
                        "--corpus", _tiny_corpus(tmp_path), "--output", tmp_path / "o"], capsys)
    assert code == 2 and "different corpus" in err and len(err.strip().splitlines()) == 1


def test_console_entry_point_reports_errors_on_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "effrag.cli", "eval", "--method", "direct-r", "--questions", str(tmp_path / "x.jsonl"),
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
    from effrag import setup

    def no_setup(*a, **kw):
        raise AssertionError("the run setup was built before the options were checked")

    monkeypatch.setattr(setup.RunSetup, "from_args", classmethod(no_setup))
    code, _, err = run(["eval", "--method", "efficientrag", "--labeler", tmp_path, "--filter", tmp_path,
                        "--questions", HOTPOT_DEV, "--corpus-from", HOTPOT_TRAIN, "--retriever", "bm25",
                        "--pool-order", "hop", "--requery-weight", "1", "--output", tmp_path / "out"], capsys)
    assert code == 2 and "requery_weight needs pool_order fused" in err
    # no --labeler/--filter is the shipped system; one of them alone is an error before any loading
    code, _, err = run(["eval", "--method", "efficientrag", "--labeler", tmp_path, "--questions", HOTPOT_DEV,
                        "--corpus-from", HOTPOT_TRAIN, "--retriever", "bm25", "--output", tmp_path / "out"], capsys)
    assert code == 2 and "needs both --labeler DIR and --filter DIR" in err


# -- issue #40: faults that used to pass silently or without the file's name --------------------------------
def test_index_build_into_an_index_refuses_and_overwrite_replaces_it(tmp_path, capsys):
    """§9: a build into a folder holding an index is refused; --overwrite removes that index's own files only."""
    corpus, idx = _tiny_corpus(tmp_path), tmp_path / "idx"
    assert run(["index", "build", "--corpus", corpus, "--retriever", "dense", "--output", idx], capsys)[0] == 0
    (idx / "notes.txt").write_text("mine")
    meta = (idx / "index_meta.json").read_text()
    code, _, err = run(["index", "build", "--corpus", corpus, "--retriever", "bm25", "--output", idx], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"effrag: error: {idx} already holds an index (index_meta.json); --overwrite replaces it, or choose another "
        "--output"]
    assert (idx / "index_meta.json").read_text() == meta and (idx / "index.faiss").is_file()
    code, _, err = run(["index", "build", "--corpus", corpus, "--retriever", "bm25", "--output", idx, "--overwrite"],
                       capsys)
    assert code == 0, err
    assert json.loads((idx / "index_meta.json").read_text())["kind"] == "bm25"
    assert not (idx / "index.faiss").exists() and (idx / "notes.txt").read_text() == "mine"
    assert run(["index", "verify", idx], capsys)[0] == 0


def test_empty_or_blank_question_is_named_by_file_and_line(tmp_path, capsys):
    """§11: a question that is empty or only whitespace is a malformed record, like a missing field."""
    lines = HOTPOT_DEV.read_text(encoding="utf-8").splitlines()[:3]
    row = json.loads(lines[1])
    row["question"] = " \t "
    qfile = tmp_path / "dev.jsonl"
    qfile.write_text("\n".join([lines[0], json.dumps(row), lines[2]]) + "\n", encoding="utf-8")
    code, _, err = run(["eval", "--method", "direct-r", "--questions", qfile, "--corpus-from", qfile, "--retriever", "bm25",
                        "--output", tmp_path / "out"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"effrag: error: {qfile}:2: field 'question': empty or only whitespace"]


def test_index_without_file_records_warns_once_and_verify_records_them(built, tmp_path, capsys, caplog):
    """§12: an index whose index_meta.json lost its ``files`` loads with one warning; ``index verify --record``
    records the files again, after which a changed byte is found."""
    import shutil

    from effrag.retrieval import load_retriever

    idx = tmp_path / "bm25"
    shutil.copytree(built / "bm25", idx)
    meta = json.loads((idx / "index_meta.json").read_text())
    recorded = meta.pop("files")
    (idx / "index_meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        load_retriever(idx)
        load_retriever(idx)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{idx}: no file hashes recorded (saved by an older effrag, or removed): the index is not "
                        f"verified; `effrag index verify {idx} --record` records them"]
    code, out, _ = run(["index", "verify", idx], capsys)
    assert code == 0 and "no hashes recorded" in out and "--record records them" in out
    code, out, err = run(["index", "verify", idx, "--record"], capsys)
    assert code == 0 and f"recorded the size and sha256 of {len(recorded)} files" in out, err
    assert json.loads((idx / "index_meta.json").read_text())["files"] == recorded
    npy = next(iter(sorted((idx / "bm25").glob("*.npy"))))
    data = bytearray(npy.read_bytes())
    data[-8:] = b"\xff" * 8
    npy.write_bytes(bytes(data))
    code, _, err = run(["index", "verify", idx], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"effrag: error: {npy}: content differs from what was saved (sha256 mismatch; file corrupted or modified); "
        "rebuild the index"]


def test_a_corrupted_predictions_file_on_resume_is_named(built, tmp_path, capsys):
    """§13: resuming an eval over a damaged predictions.jsonl or config.json names the file and line."""
    out = tmp_path / "run"
    argv = ["eval", "--method", "direct-r", "--questions", HOTPOT_DEV, "--index", built / "bm25", "--retriever", "bm25", "--k", 3,
            "--limit", 3, "--output", out]
    assert run(argv, capsys)[0] == 0
    preds = out / "predictions.jsonl"
    good = preds.read_bytes()
    lines = good.splitlines(keepends=True)
    preds.write_bytes(lines[0] + lines[1][:20] + b"\xff" * 16 + lines[1][36:] + b"".join(lines[2:]))
    code, _, err = run(argv, capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"effrag: error: {preds}:2: not UTF-8 (byte 0xff at column 21); delete the file or use another output"]
    preds.write_bytes(good)
    config = out / "config.json"
    config.write_text(config.read_text()[:40])
    code, _, err = run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"effrag: error: {config}: unreadable")


def test_eval_usage_names_each_option_once(capsys):
    """§14: ``eval --method efficientrag --help`` printed each loop option's name twice (``--hop-k HOP_K``)."""
    import re

    code, out, _ = run(["eval", "--method", "efficientrag", "--help"], capsys)
    usage = out.split("\n\n")[0]
    assert code == 0 and usage.count("usage:") == 1
    flags = re.findall(r"\[?(--[\w-]+)", usage)
    assert len(flags) == len(set(flags)) and "--tag-threshold" in flags
    assert not [f for f, m in re.findall(r"(--[\w-]+) ([A-Z_]{2,})", usage) if f[2:].upper().replace("-", "_") == m]
    assert "[--tag-threshold X]" in " ".join(usage.split()) and "[--hop-k N]" in " ".join(usage.split())
