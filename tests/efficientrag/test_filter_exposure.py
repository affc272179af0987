"""``effrag filter-data``: Filter records rebuilt on a trained Labeler's own kept words (exposure augmentation).

The Labeler is real (the tiny checkpoint of tests/conftest.py) with its token head set to keep every word,
so the predicted Info block is known: the whole chunk.
"""
from __future__ import annotations

import json

import pytest
import torch

from data_synthesis.filter_exposure import exposed_filter_records, relabel_info, split_filter_words
from effrag.text import filter_input_words, words

QUERY = "Who founded the company that distributed UHF?"
CHUNK = words("UHF : UHF was distributed by Orion Pictures , and Orion Pictures was founded in 1978 .")


@pytest.fixture(scope="module")
def keep_all_labeler(tiny_efficientrag_dirs, tmp_path_factory):
    from effrag.models import LabelerModel

    lab = LabelerModel.from_pretrained(tiny_efficientrag_dirs["labeler"]).eval()
    with torch.no_grad():
        lab.token_head.proj.weight.zero_()
        lab.token_head.proj.bias.copy_(torch.tensor([0.0, 20.0]))
    path = tmp_path_factory.mktemp("keep_all") / "labeler"
    lab.save_pretrained(path)
    return lab, path


def records():
    """One question's synthesised records: the gold chunk (oracle keeps "Orion Pictures"), a negative chunk,
    the Filter record built on the oracle words, and a Filter record whose Info block no Labeler record gave."""
    oracle = [int(w in ("Orion", "Pictures")) if i < 8 else 0 for i, w in enumerate(CHUNK)]
    labeler = [
        {"qid": "q1", "dataset": "musique", "hop": 1, "query": QUERY, "chunk_id": "c1", "chunk_words": CHUNK,
         "labels": oracle, "tag": 1},
        {"qid": "q1", "dataset": "musique", "hop": 1, "query": QUERY, "chunk_id": "c2",
         "chunk_words": words("Weird Al : a singer ."), "labels": [0] * 6, "tag": 0},
    ]
    src = filter_input_words(QUERY, [["Orion", "Pictures"]])
    nq = len(words(QUERY))
    filt = [{"qid": "q1", "dataset": "musique", "source": "annotation", "hop": 1, "words": src,
             "labels": [1, 1, 0, 0, 0, 0, 0, 0] + [0, 0, 1, 1], "target": "Who founded Orion Pictures"},
            {"qid": "q1", "dataset": "musique", "source": "annotation", "hop": 1,
             "words": filter_input_words(QUERY, [["Paramount"]]), "labels": [0] * (nq + 3), "target": ""}]
    assert len(src) == nq + 4 and len(filt[0]["labels"]) == len(src)
    return labeler, filt


def test_split_and_relabel_mark_every_occurrence_of_the_oracle_words():
    q, blocks = split_filter_words(filter_input_words("Who founded it ?", [["Orion", "Pictures"], ["x"]]))
    assert q == ["Who", "founded", "it", "?"] and blocks == [["Orion", "Pictures"], ["x"]]
    ws = filter_input_words("Who founded it ?", [["Orion", "Pictures"], ["x"]])
    assert split_filter_words(ws, list(range(len(ws)))) == ([0, 1, 2, 3], [[6, 7], [10]])  # values split alike
    assert split_filter_words(["no", "info"]) == (["no", "info"], [])
    src, labels = relabel_info([1, 1, 0, 0], [["Orion", "Pictures", "film"]], [[1, 1, 0]], q,
                               [["UHF", "Orion", "Pictures", "distributed", "Orion", "of", "Pictures", "."]])
    assert src == q + ["Info", ":", "UHF", "Orion", "Pictures", "distributed", "Orion", "of", "Pictures", "."]
    # the query keeps its labels; both "Orion Pictures" are kept, "of" as glue between kept words; the rest not
    assert labels == [1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0]


def test_exposed_records_carry_the_labelers_words_and_skip_what_cannot_be_matched(keep_all_labeler):
    lab, _ = keep_all_labeler
    labeler, filt = records()
    out, counts = exposed_filter_records(labeler, filt, lab.predict, token_threshold=0.5)
    assert counts["filter_records"] == 2 and counts["unmatched"] == 1 and counts["records"] == 1
    (rec,) = out
    nq = len(words(QUERY))
    assert rec["words"] == words(QUERY) + ["Info", ":"] + CHUNK  # the Labeler kept the whole chunk
    assert rec["labels"][:nq] == filt[0]["labels"][:nq]
    kept = [w for w, lab_ in zip(rec["words"][nq:], rec["labels"][nq:]) if lab_]
    assert kept == ["Orion", "Pictures", "Orion", "Pictures"]  # every occurrence, in the Labeler's words
    assert rec["source"] == "annotation+labeler" and rec["qid"] == "q1" and rec["hop"] == 1


def test_filter_data_cli_writes_the_original_and_new_records_and_reuses_a_finished_run(keep_all_labeler, tmp_path,
                                                                                       capsys):
    from effrag.cli import main

    _, path = keep_all_labeler
    labeler, filt = records()
    synth = tmp_path / "synth"
    synth.mkdir()
    for name, rows in (("labeler.jsonl", labeler), ("filter.jsonl", filt)):
        (synth / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["filter-data", "--synth", str(synth), "--labeler", str(path), "--output", str(tmp_path / "out"),
            "--token-threshold", "0.5", "--quiet"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "filter.jsonl").read_text().splitlines()]
    assert rows[:2] == filt and len(rows) == 3 and rows[2]["source"] == "annotation+labeler"
    info = json.loads((tmp_path / "out" / "filter_data.json").read_text())
    assert info["exposed_records"] == 1 and info["counts"]["unmatched"] == 1 and info["labeler"] == str(path)
    before = (tmp_path / "out" / "filter.jsonl").stat().st_mtime_ns
    assert main(argv[:-1]) == 0 and "reused" in capsys.readouterr().out
    assert (tmp_path / "out" / "filter.jsonl").stat().st_mtime_ns == before
    (synth / "filter.jsonl").write_text("")
    assert main([*argv[:5], "--output", str(tmp_path / "empty"), "--quiet"]) == 2
    assert "has no records" in capsys.readouterr().err
    (synth / "filter.jsonl").write_text(json.dumps(filt[0]) + "\n\n" + json.dumps({"qid": "q2"}) + "\n")
    assert main([*argv[:5], "--output", str(tmp_path / "bad"), "--quiet"]) == 2  # named by file and line
    assert "filter.jsonl:3: record has no hop, words, labels" in capsys.readouterr().err
