"""Readers answering by majority vote (effrag.models.ReaderVote): the vote rule, the folder format, errors.

Member readers are untrained on the tiny encoder of test_models.py (built in code, no download), with
different seeds so that they read differently.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_base  # noqa: E402

from effrag.models import ExtractiveReader, ReaderVote, load_model, load_reader, load_reader_checkpoint  # noqa: E402
from effrag.models.reader import ReaderAnswer  # noqa: E402
from effrag.models.reader_vote import vote  # noqa: E402


def _answer(text: str, confidence: float, answer_type: str = "span") -> ReaderAnswer:
    return ReaderAnswer(text, confidence, 0, len(text), 0.0, answer_type)


def test_vote_takes_the_majority_after_normalisation_and_breaks_ties_by_confidence():
    # "The Beatles" and "beatles." are one answer after the official normalisation: 2 votes beat a confident 1
    assert vote([_answer("The Beatles", 0.1), _answer("Queen", 9.0), _answer("beatles.", 0.2)]) == 2  # tie inside: f
    # yes/no answers vote by what is answered, not by the span text under them
    assert vote([_answer("x", 0.0, "yes"), _answer("Paris", 5.0), _answer("y", 1.0, "yes")]) == 2
    # no majority: the most confident answer; equal confidence: the first member
    assert vote([_answer("a", 1.0), _answer("b", 3.0), _answer("c", 2.0)]) == 1
    assert vote([_answer("a", 1.0), _answer("b", 1.0)]) == 0
    with pytest.raises(ValueError, match="no answers"):
        vote([])


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> list[Path]:
    import torch

    root = tmp_path_factory.mktemp("vote")
    base = make_base("electra", root / "base")
    dirs = []
    for seed in range(3):
        torch.manual_seed(seed)  # different random heads: the members disagree
        d = root / f"reader-{seed}"
        ExtractiveReader.from_encoder(base, options={"max_length": 96}).save_pretrained(d)
        dirs.append(d)
    return dirs


def test_a_vote_folder_reads_like_a_reader_and_answers_what_its_members_voted(members, tmp_path):
    out = tmp_path / "checkpoints" / "reader-vote"
    meta = ReaderVote.write(out, members)
    assert not any(Path(m).is_absolute() for m in meta["members"])  # relative to the folder
    assert all((out / m).resolve() == d.resolve() for m, d in zip(meta["members"], members))
    opened = load_reader(out)
    assert isinstance(opened, ReaderVote) and isinstance(load_model(out), ReaderVote)
    assert len(opened.members) == 3 and set(opened.decoding()) == {m.name for m in members}
    singles = [load_reader_checkpoint(m).eval() for m in members]
    opened.eval()
    question = "Which city hosted the games?"
    passages = ["Games: The 1908 games were held in London.", "London: London is the capital of England.",
                "Paris: Paris hosted the 1900 games."]
    answer, window = opened.read(question, passages)
    alone = [r.read(question, passages) for r in singles]
    assert len({a.answer for a, _ in alone}) > 1  # the members disagree, so the vote decides something
    winner = vote([a for a, _ in alone])
    assert answer == alone[winner][0] and window == alone[winner][1]
    # pairs (SearChain's verifier): one voted answer per pair
    pairs = opened.predict([question] * 3, passages)
    per_member = [r.predict([question] * 3, passages) for r in singles]
    assert pairs == [group[vote(group)] for group in zip(*per_member)]


def test_a_vote_folder_survives_being_moved_with_its_members(members, tmp_path):
    import shutil

    tree = tmp_path / "a" / "checkpoints"
    for m in members:
        shutil.copytree(m, tree / m.name)
    ReaderVote.write(tree / "reader-vote", [tree / m.name for m in members])
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))  # members are stored relative to the folder
    assert len(load_reader(tmp_path / "b" / "checkpoints" / "reader-vote").members) == 3


def test_bad_vote_folders_name_the_field_and_the_member(members, tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        ReaderVote([load_reader_checkpoint(members[0])])
    out = tmp_path / "vote"
    ReaderVote.write(out, members[:2])
    meta = json.loads((out / "effrag_config.json").read_text())
    meta["members"][1] = "../missing-reader"
    (out / "effrag_config.json").write_text(json.dumps(meta))
    with pytest.raises(FileNotFoundError, match=r"members\[1\] '\.\./missing-reader'.*no reader checkpoint"):
        load_reader(out)
    meta["members"] = ["../x"]
    (out / "effrag_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="'members' must list at least 2"):
        load_reader(out)
    with pytest.raises(FileNotFoundError, match="no heads.safetensors"):  # neither a reader nor a vote
        load_reader(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="--members .*nowhere.*no reader checkpoint"):
        ReaderVote.write(tmp_path / "v2", [members[0], tmp_path / "nowhere"])


def test_eval_answers_with_a_vote_folder(members, tmp_path):
    from effrag.cli import main
    from effrag.data import sample_path

    out = tmp_path / "reader-vote"
    ReaderVote.write(out, members)
    argv = ["eval", "--method", "direct-r", "--reader", str(out), "--questions", str(sample_path("hotpotqa", "dev")),
            "--corpus-from", str(sample_path("hotpotqa", "train")), "--retriever", "bm25", "--k", "3", "--limit", "2",
            "--output", str(tmp_path / "run")]
    assert main(argv) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())["run"]
    assert config["reader"]["path"] == str(out) and config["reader"]["model"]  # the vote's fingerprint
    rows = (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == 2 and all(json.loads(r)["llm_calls"] == 0 for r in rows)
