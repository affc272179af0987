"""The Labeler's accuracy by kind of record (effrag.evaluation.labeler_breakdown), and its command line
scripts/probes/labeler_breakdown.py: the table it writes and its bad-input errors."""
from __future__ import annotations

import json

import pytest
from helpers import run_script

from effrag.evaluation.labeler_breakdown import breakdown, read_records


def _rec(qid, hop, query, tag):
    return {"qid": qid, "hop": hop, "query": query, "tag": tag, "chunk_words": ["x"]}


def test_rows_split_gold_by_hop_and_by_the_query_it_is_read_under():
    q = "Who founded the company that distributed UHF?"
    records = [_rec("a", 1, q, 1), _rec("a", 2, "Who founded Orion Pictures", 1), _rec("a", 2, q, 1),
               _rec("a", 1, q, 0), _rec("a", 4, "Who founded Orion", 1), _rec("b", 2, "When was X", 1)]
    rows = {r["kind"]: r for r in breakdown(records, [0.9, 0.4, 0.2, 0.7, 0.6, 0.8])}
    assert rows["gold, hop 1, under the question"] == {"kind": "gold, hop 1, under the question", "n": 1,
                                                       "accuracy": 1.0, "mean_p_continue": 0.9}
    assert rows["gold, hop 2, under the question"]["accuracy"] == 0.0
    assert rows["negative"]["accuracy"] == 0.0  # p 0.7 on a non-gold chunk is a miss
    assert rows["gold, hop 3+, under its query"]["n"] == 1
    # question b has no hop-1 record: its question is unknown, so its hop-2 record counts as under its query
    assert rows["gold, hop 2, under its query"]["n"] == 2
    assert rows["gold, hop 2, under its query"]["mean_p_continue"] == pytest.approx(0.6)
    assert next(iter(rows)) == "negative"


def test_a_bad_records_file_is_named_with_its_line(tmp_path):
    f = tmp_path / "labeler.jsonl"
    f.write_text('{"qid": "a", "query": "q", "chunk_words": ["x"], "tag": 1}\n{"qid": "b"}\n')
    with pytest.raises(ValueError, match=r"labeler\.jsonl:2: not a labeler record"):
        read_records(f)
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file"):
        read_records(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no records"):
        read_records(tmp_path / "empty.jsonl")
    # the command line: one error line naming the file, before any model loads (--labeler L is not a folder)
    proc = run_script("probes/labeler_breakdown", "--labeler", "L", "--records", tmp_path / "empty.jsonl",
                      "--output", tmp_path / "o")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"labeler_breakdown: error: {tmp_path / 'empty.jsonl'}: no records"], proc.stderr
    assert not (tmp_path / "o").exists()


def test_without_a_labeler_it_counts_the_records_of_each_kind(tmp_path):
    q = "Who founded the company that distributed UHF?"
    f = tmp_path / "labeler.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [_rec("a", 1, q, 1), _rec("a", 2, q, 1), _rec("a", 2, "x", 1)]))
    proc = run_script("probes/labeler_breakdown", "--records", f, "--output", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "o" / "breakdown.json").read_text())["rows"]
    assert [(r["kind"], r["n"], r["accuracy"]) for r in rows] == [
        ("gold, hop 1, under the question", 1, None), ("gold, hop 2, under its query", 1, None),
        ("gold, hop 2, under the question", 1, None)]
    assert "| gold, hop 2, under its query | 1 | - | - |" in (tmp_path / "o" / "breakdown.md").read_text()
    assert "| gold, hop 2, under its query | 1 | - | - |" in proc.stdout
