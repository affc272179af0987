"""A smaller pool ranker distilled from a trained one: teacher scores, the soft-target loss, the cut student.

Real tiny models (tests/conftest.py ``tiny_efficientrag_dirs``: a 2-layer ranker as the teacher), real BM25 groups
from the bundled HotpotQA train sample, real training with ``effrag.training.train``.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from effrag.models import RankerModel, load_model
from effrag.models.ranker import distill_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """`effrag synthesize` then `effrag ranker-data` (BM25, groups of 4) on 12 HotpotQA train sample questions."""
    from helpers import make_ranker_groups

    root = tmp_path_factory.mktemp("distill")
    make_ranker_groups(root, 12)
    return root


@pytest.fixture(scope="module")
def scored(groups, tiny_efficientrag_dirs):
    from effrag.cli import main

    out = groups / "teacher"
    assert main(["ranker-teacher", "--data", str(groups / "groups"), "--teacher", str(tiny_efficientrag_dirs["ranker"]),
                 "--output", str(out), "--quiet"]) == 0
    return out


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _same_scores(a, b) -> bool:
    """The same groups with the same teacher scores (batches of another size may move the last decimal)."""
    ra, rb = _records(a), _records(b)
    strip = [[{k: v for k, v in c.items() if k != "teacher"} for c in r["candidates"]] for r in ra]
    return (len(ra) == len(rb) and strip == [[{k: v for k, v in c.items() if k != "teacher"} for c in r["candidates"]]
                                             for r in rb]
            and all(c["teacher"] == pytest.approx(d["teacher"], abs=1e-3) for x, y in zip(ra, rb)
                    for c, d in zip(x["candidates"], y["candidates"])))


# ---------------------------------------------------------------------- the loss
def test_distill_loss_is_the_kl_from_the_teachers_softmax_and_skips_unscored_groups():
    teacher = torch.tensor([3.0, 1.0, 0.0, math.nan, math.nan, 2.0, 2.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    student = torch.tensor([1.0, 1.0, 0.0, 5.0, 0.0, 0.0, 0.0])
    p = torch.softmax(teacher[:3], 0)
    kl0 = float((p * (p.log() - torch.log_softmax(student[:3], 0))).sum())
    # group 1 has no teacher scores (a dev group): skipped; group 2's student already matches its teacher: 0
    assert distill_loss(student, teacher, group).item() == pytest.approx(kl0 / 2, rel=1e-5)
    assert distill_loss(teacher[:3] + 7.0, teacher[:3], group[:3]).item() == pytest.approx(0.0, abs=1e-6)
    assert distill_loss(student[3:5], teacher[3:5], group[3:5]) is None
    # temperature: T^2 * KL of the softened distributions
    t = 2.0
    pt, ps = torch.softmax(teacher[:3] / t, 0), torch.log_softmax(student[:3] / t, 0)
    expected = float((pt * (pt.log() - ps)).sum()) * t * t
    assert distill_loss(student[:3], teacher[:3], group[:3], t).item() == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------- teacher scores
def test_ranker_teacher_scores_every_candidate_as_the_teacher_reads_it(groups, scored, tiny_efficientrag_dirs):
    from effrag.text import chunk_text

    plain, out = _records(groups / "groups" / "ranker.jsonl"), _records(scored / "ranker.jsonl")
    assert len(out) == len(plain) > 10
    teacher = load_model(tiny_efficientrag_dirs["ranker"])
    for a, b in zip(plain[:5], out[:5]):
        assert [{k: v for k, v in c.items() if k != "teacher"} for c in b["candidates"]] == a["candidates"]
        want = teacher.predict([a["query"]] * len(a["candidates"]),
                               [chunk_text(c["title"], c["text"]).split() for c in a["candidates"]])
        assert [c["teacher"] for c in b["candidates"]] == pytest.approx(want, abs=1e-4)
    info = json.loads((scored / "ranker_teacher.json").read_text())
    assert info["groups"] == len(out) and info["pairs"] == sum(len(r["candidates"]) for r in out)
    assert not (scored / "ranker.jsonl.partial").exists()


def test_ranker_teacher_resumes_after_a_torn_line_and_restarts_for_another_teacher(groups, scored,
                                                                                 tiny_efficientrag_dirs, tmp_path):
    """A run killed mid-write leaves a partial file whose last line is cut: the resumed run keeps the whole lines,
    scores the rest and gives the same file; a partial begun with another teacher is thrown away."""
    from data_synthesis.teacher_scores import write_teacher_scores

    full = (scored / "ranker.jsonl").read_bytes()
    lines = full.splitlines(keepends=True)
    out = tmp_path / "resumed"
    write_teacher_scores(groups / "groups", tiny_efficientrag_dirs["ranker"], out, show_progress=False,
                         records_per_step=4)  # a clean run records its settings; take them for the partial
    started = json.loads((out / "ranker_teacher.json").read_text())
    settings = {k: started[k] for k in ("data", "data_bytes", "teacher_fingerprint", "max_length", "bf16")}
    (out / "ranker.jsonl").unlink()
    (out / "ranker_teacher.partial.json").write_text(json.dumps(settings))
    (out / "ranker.jsonl.partial").write_bytes(b"".join(lines[:3]) + lines[3][:40])  # torn 4th line
    info = write_teacher_scores(groups / "groups", tiny_efficientrag_dirs["ranker"], out, show_progress=False,
                                records_per_step=4)
    assert info["resumed_at"] == 3 and _same_scores(out / "ranker.jsonl", scored / "ranker.jsonl")
    assert (out / "ranker.jsonl").read_bytes().startswith(b"".join(lines[:3]))  # the whole lines were kept as written
    # a partial of another teacher: not resumed, scored again from the start
    (out / "ranker_teacher.partial.json").write_text(json.dumps({**settings, "teacher_fingerprint": "other"}))
    (out / "ranker.jsonl.partial").write_bytes(b"".join(lines[:3]).replace(b'"teacher": ', b'"teacher": 1'))
    info = write_teacher_scores(groups / "groups", tiny_efficientrag_dirs["ranker"], out, show_progress=False)
    assert info["resumed_at"] == 0 and _same_scores(out / "ranker.jsonl", scored / "ranker.jsonl")


def test_ranker_teacher_names_a_bad_line(tmp_path, tiny_efficientrag_dirs, capsys):
    from helpers import run_cli

    bad = tmp_path / "ranker.jsonl"
    bad.write_text('{"query": "q", "candidates": [{"title": "t", "text": "x", "gold": 1}]}\n{"query": 3}\n')
    code, _, err = run_cli(["ranker-teacher", "--data", bad, "--teacher", str(tiny_efficientrag_dirs["ranker"]),
                            "--output", tmp_path / "out", "--quiet"], capsys)
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and len(lines) == 1 and f"{bad}:2: not a ranker group" in lines[0]


GROUP = b'{"query": "q", "candidates": [{"title": "t", "text": "x", "gold": 1}]}\n'


@pytest.mark.parametrize("data, message", [
    (GROUP + b'{"query": "q", "candidates": [{"title": "t", "text": 5, "gold": 1}]}\n',
     "{bad}:2: candidates[0] field 'text': expected a string, got int 5"),
    (GROUP + b'{"query": "caf\xe9", "candidates": []}\n',  # latin-1
     "{bad}:2: not UTF-8 (byte 0xe9 at column 15, byte offset 85); re-save the file as UTF-8"),
    (b"", "{bad}: no ranker groups (an empty file); make it with `effrag ranker-data`"),
], ids=["text-not-a-string", "latin-1-byte", "empty-file"])
def test_ranker_teacher_inputs_it_cannot_score_are_one_line_naming_file_and_line(tmp_path, tiny_efficientrag_dirs,
                                                                                capsys, data, message):
    """A wrong type was a TypeError traceback, a latin-1 byte an error naming no file, an empty file exit 0 with 0
    groups written."""
    from helpers import run_cli

    bad = tmp_path / "ranker.jsonl"
    bad.write_bytes(data)
    code, _, err = run_cli(["ranker-teacher", "--data", bad, "--teacher", str(tiny_efficientrag_dirs["ranker"]),
                            "--output", tmp_path / "out", "--quiet"], capsys)
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and "Traceback" not in err and lines == [f"effrag: error: {message.format(bad=bad)}"]
    assert not (tmp_path / "out" / "ranker.jsonl").exists()


@pytest.mark.parametrize("name", ["ranker_teacher.partial.json", "ranker_teacher.json", "ranker_data.json"])
def test_a_torn_teacher_state_file_is_one_line_naming_it(groups, scored, tiny_efficientrag_dirs, tmp_path, capsys,
                                                         name):
    """Each ended in `effrag: error: Expecting value: line 1 column 10`, naming no file: the settings of a partial
    run, a finished run's record, and the ranker_data.json of the groups scored."""
    import shutil

    from helpers import run_cli

    data, out = groups / "groups", tmp_path / "out"
    if name == "ranker_data.json":  # the groups' own record, read once they are scored
        data = shutil.copytree(groups / "groups", tmp_path / "groups")
        torn = data / name
    elif name == "ranker_teacher.json":  # a finished output, checked for reuse
        torn = shutil.copytree(scored, out) / name
    else:  # a partial output's settings
        out.mkdir()
        (out / "ranker.jsonl.partial").write_bytes((scored / "ranker.jsonl").read_bytes().splitlines(True)[0])
        torn = out / name
        torn.write_text(json.dumps({"data": str(data), "data_bytes": 0}))
    torn.write_bytes(torn.read_bytes()[:9])
    code, _, err = run_cli(["ranker-teacher", "--data", data, "--teacher", str(tiny_efficientrag_dirs["ranker"]),
                            "--output", out, "--quiet"], capsys)
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"effrag: error: {torn}: not a readable state file (torn or damaged JSON: ")


# ---------------------------------------------------------------------- the student
def _agreement(model, scored) -> float:
    """Spearman correlation of the model's scores with the teacher's over every candidate of the scored groups."""
    from scipy.stats import spearmanr

    from effrag.text import chunk_text

    t, s = [], []
    for r in _records(scored / "ranker.jsonl"):
        cands = r["candidates"]
        t += [c["teacher"] for c in cands]
        s += model.predict([r["query"]] * len(cands), [chunk_text(c["title"], c["text"]).split() for c in cands])
    return float(spearmanr(t, s).statistic)


def _student_config(name_or_path, data, out, weight, epochs=4):
    return {"model": {"name_or_path": str(name_or_path), "num_layers": 1, "max_length": 64,
                      "freeze": ["embeddings.word_embeddings"],
                      "extra_options": {"distill_weight": weight, "distill_temperature": 1.0}},
            "data": {"train_file": data, "eval_files": [data], "max_eval_examples": None},
            "train": {"output_dir": str(out), "epochs": epochs, "lr": 3e-3, "batch_size": 4, "seed": 0,
                      "mixed_precision": "no", "save_every": 0, "log_every": 1, "warmup_ratio": 0.0}}


def test_a_distilled_student_follows_its_teachers_order_more_than_one_trained_on_the_gold(scored, tmp_path):
    """A 1-layer student of a fresh 2-layer BERT, trained on the same groups with the teacher's soft targets and
    with the gold labels only: the soft targets carry the teacher's order of the negatives too."""
    from helpers import tiny_bert_base

    from effrag.training import load_config, train

    base = tiny_bert_base(tmp_path / "base")
    data = str(scored / "ranker.jsonl")
    agreement = {}
    for weight in (0.0, 1.0):
        train(load_config("ranker", _student_config(base, data, tmp_path / f"w{weight}", weight)))
        student = load_model(tmp_path / f"w{weight}" / "last")
        assert student.encoder.config.num_hidden_layers == 1 and len(student.encoder.encoder.layer) == 1
        agreement[weight] = _agreement(student, scored)
    assert agreement[1.0] > 0.4 and agreement[1.0] > agreement[0.0] + 0.25, agreement


def test_a_student_cut_from_a_trained_ranker_keeps_its_first_layers_and_word_embeddings(scored, tiny_efficientrag_dirs,
                                                                                       tmp_path):
    from effrag.training import load_config, train

    teacher_dir = tiny_efficientrag_dirs["ranker"]
    teacher = load_model(teacher_dir)
    train(load_config("ranker", _student_config(teacher_dir, str(scored / "ranker.jsonl"), tmp_path / "run", 0.5,
                                                epochs=1)))
    student = load_model(tmp_path / "run" / "last")
    assert isinstance(student, RankerModel) and student.options["distill_weight"] == 0.5
    assert student.encoder.config.num_hidden_layers == 1 and len(student.encoder.encoder.layer) == 1
    assert torch.equal(student.encoder.embeddings.word_embeddings.weight,
                       teacher.encoder.embeddings.word_embeddings.weight)  # frozen: the teacher's
    assert not torch.equal(student.encoder.encoder.layer[0].attention.self.query.weight,
                           teacher.encoder.encoder.layer[0].attention.self.query.weight)  # trained from the teacher's


def test_distilling_without_teacher_scores_is_refused(groups, tiny_efficientrag_dirs, tmp_path):
    from effrag.training import load_config, train

    data = str(groups / "groups" / "ranker.jsonl")  # no "teacher" fields
    cfg = {"model": {"name_or_path": str(tiny_efficientrag_dirs["ranker"]), "num_layers": 1, "max_length": 64,
                     "extra_options": {"distill_weight": 0.5}},
           "data": {"train_file": data, "eval_files": []},
           "train": {"output_dir": str(tmp_path / "run"), "epochs": 1, "mixed_precision": "no", "save_every": 0}}
    with pytest.raises(ValueError, match="effrag ranker-teacher"):
        train(load_config("ranker", cfg))
    with pytest.raises(ValueError, match="num_layers must be between 1 and 2"):
        train(load_config("ranker", {**cfg, "model": {**cfg["model"], "num_layers": 5}}))
