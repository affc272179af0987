"""The ``reader`` task: SearChain's extractive reader built from dataset files and trained by the one loop.

A tiny encoder from tests/helpers.py (built in code, no download) on records of the bundled sample.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_base, reset_accelerate, run_script

from data_synthesis.reader_records import write_reader_data
from effrag.data import sample_path
from effrag.models import ExtractiveReader, load_model
from effrag.training import evaluate_only, load_config, train
from effrag.training.data import RecordError, read_jsonl
from effrag.training.tasks.reader import check_reader_record

DATASETS = ("hotpotqa", "2wikimqa", "musique")
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("reader")
    stats = write_reader_data([sample_path(d, "train") for d in DATASETS], root / "train", limit=10)
    write_reader_data([sample_path(d, "dev") for d in DATASETS], root / "dev", limit=3)
    return {"base": make_base("electra", root / "base"), "stats": stats,
            "train": str(root / "train" / "reader.jsonl"), "dev": str(root / "dev" / "reader.jsonl")}


def test_records_from_dataset_files_are_spans_and_no_answer_documents(data):
    recs = read_jsonl(data["train"], check_reader_record)  # every record passes the task's check
    assert len(recs) == data["stats"]["records"] and data["stats"]["questions"] == 30
    answerable = [r for r in recs if r["answer_start"] is not None or r.get("answer_type") in ("yes", "no")]
    assert len(answerable) == data["stats"]["answerable"] and 0 < len(answerable) < len(recs)
    yes_no = [r for r in recs if r.get("answer_type") in ("yes", "no")]
    assert yes_no and all(r["answer"] == r["answer_type"] and r["answer_start"] is None for r in yes_no)
    joint = [r for r in recs if "\n" in r["context"]]  # passages read together
    assert any(r["answer_start"] is not None for r in joint) and any(r["answer_start"] is None for r in joint)
    assert {r["dataset"] for r in recs} == set(DATASETS)
    assert not any("#1" in r["question"] for r in recs if r["dataset"] == "musique")  # references resolved
    bad = {**answerable[0], "answer_start": answerable[0]["answer_start"] + 1}
    with pytest.raises(RecordError, match=r"x.jsonl:3: field 'answer' .* is not at context"):
        check_reader_record(bad, "x.jsonl:3")
    with pytest.raises(RecordError, match=r"x.jsonl:4: field 'answer_type' must be one of"):
        check_reader_record({**yes_no[0], "answer_type": "maybe"}, "x.jsonl:4")
    with pytest.raises(RecordError, match=r"x.jsonl:5: a 'yes' answer has no span"):
        check_reader_record({**yes_no[0], "answer_type": "yes", "answer_start": 0}, "x.jsonl:5")


def test_joint_records_come_one_per_distractor_count(tmp_path):
    from data_synthesis.reader_records import build_reader_examples
    from effrag.data import load_questions
    from effrag.text import PASSAGE_SEPARATOR, reader_passage

    questions = load_questions(sample_path("hotpotqa", "train"), limit=5)
    joint = lambda recs: [r for r in recs if PASSAGE_SEPARATOR in r["context"]]  # noqa: E731
    one = build_reader_examples(questions, joint_distractors=1)  # one joint record per question
    three = build_reader_examples(questions, joint_distractors=(1, 0, 3))
    answering = lambda recs: [r for r in joint(recs) if r["answer_start"] is not None or r.get("answer_type")]  # noqa
    assert len(answering(three)) == 3 * len(answering(one)) > 0
    assert len(joint(three)) - len(answering(three)) == len(joint(one)) - len(answering(one))  # no-answer: once
    for q in questions:  # the 0-distractor copy is exactly the gold passages (any order): oracle reading's input
        gold = sorted(reader_passage(p.title, p.text) for p in q.gold)
        assert any(sorted(r["context"].split(PASSAGE_SEPARATOR)) == gold for r in answering(three)
                   if r["question"] == q.question)


def test_span_targets_mark_every_occurrence_and_the_loss_is_their_marginal(data):
    import torch

    from effrag.models.reader import span_loss
    from effrag.training.tasks.reader import answer_occurrences, featurize_reader

    ctx = "Paris: Paris is in France.\nComparis: PARIS hosts it; Parisian food."
    own = ctx.index("Paris is")
    # case-insensitive, never inside a longer word ("Comparis", "Parisian"), the record's own first
    assert answer_occurrences(ctx, "Paris", own) == [own, 0, ctx.index("PARIS")]
    assert answer_occurrences("a (b) c (b)", "(b)", 2) == [2, 8]  # punctuation at the ends: plain substring

    rec = {"question": "Where is it?", "context": ctx, "answer": "Paris", "answer_start": own}
    none = {"question": "Where is it?", "context": ctx, "answer": "", "answer_start": None}
    yes = {"question": "Is it?", "context": ctx, "answer": "yes", "answer_start": None, "answer_type": "yes"}
    every = ExtractiveReader.from_encoder(data["base"], options={"span_targets": "all"})
    first = ExtractiveReader.from_encoder(data["base"])  # the default
    f_all, f_none, f_yes = featurize_reader(every, [rec, none, yes], 96)
    (f_first,) = featurize_reader(first, [rec], 96)
    assert sum(f_all["start_targets"]) == sum(f_all["end_targets"]) == 3
    assert f_all["start_targets"][f_all["start_positions"]] == 1  # the record's own span is among them
    assert f_first["start_targets"] == [int(i == f_all["start_positions"]) for i in range(len(f_all["input_ids"]))]
    assert f_none["start_targets"][0] == 1 == sum(f_none["start_targets"])  # no answer: [CLS]
    assert sum(f_yes["start_targets"]) == 0  # yes/no: no span target, skipped by the loss
    (cut,) = featurize_reader(every, [rec], 16)  # truncation keeps only the occurrences that fit
    assert 0 < sum(cut["start_targets"]) < 3

    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    one, two = torch.tensor([[0, 0, 1, 0]]), torch.tensor([[0, 1, 1, 0]])
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor([2]))
    assert span_loss(logits, logits, one, one) == pytest.approx(float(ce))  # one target: cross-entropy
    p = logits.softmax(-1)[0]
    assert span_loss(logits, logits, two, two) == pytest.approx(-float(torch.log(p[1] + p[2])))
    rows = torch.cat([logits, logits]), torch.cat([one, torch.zeros_like(one)])
    assert span_loss(rows[0], rows[0], rows[1], rows[1], reduction="none").tolist() == pytest.approx([float(ce), 0.0])
    assert span_loss(rows[0], rows[0], rows[1], rows[1]) == pytest.approx(float(ce))  # mean skips target-less rows
    with pytest.raises(ValueError, match="span_targets"):
        ExtractiveReader.from_encoder(data["base"], options={"span_targets": "some"})


def test_train_reader_reduces_loss_predicts_spans_and_round_trips(data, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("reader", {  # the packaged configs/reader.yaml, by name
        "model": {"name_or_path": data["base"], "max_length": 96},
        "data": {"train_file": data["train"], "eval_files": [data["dev"]]},
        "train": {"output_dir": str(out), "max_steps": 30, "batch_size": 8, "lr": 2e-3, "log_every": 1,
                  "mixed_precision": "no", "save_every": 0}})
    res = train(cfg)
    assert res["task"] == "reader" and res["global_step"] == 30 and res["metric_for_best"] == "answer_exact"
    ev = res["eval"]
    assert ev["n"] == sum(ev[f"{d}/n"] for d in DATASETS) and 0 < ev["answerable"] < ev["n"]
    losses = [r["train/loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "train/loss" in r]
    assert sum(losses[-5:]) < sum(losses[:5])

    model = load_model(out / "last")
    assert isinstance(model, ExtractiveReader)
    recs = read_jsonl(data["dev"], check_reader_record)[:6]
    answers = model.predict([r["question"] for r in recs], [r["context"] for r in recs])
    for a, r in zip(answers, recs):
        assert a.text and a.text == r["context"][a.start:a.end] and a.end - a.start >= len(a.text.strip())
    model.save_pretrained(tmp_path / "copy")
    again = ExtractiveReader.from_pretrained(tmp_path / "copy").predict([r["question"] for r in recs],
                                                                       [r["context"] for r in recs])
    assert again == answers
    reset_accelerate()
    assert evaluate_only(cfg, str(out / "last"))["span_loss"] == pytest.approx(ev["span_loss"], rel=1e-5)

    # the recipe's model card for it, from the run's own files
    from effrag.training.cards import model_card  # scripts/train_models.py installs with it

    tune = ("python scripts/tune_reader.py --reader checkpoints/reader-tiny --data ../shared/data --write --output "
            "checkpoints/reader-tiny/decoding")  # the recipe's after-install step
    card = model_card("tiny", "reader", out, ["nice accelerate launch train.py --config configs/reader.yaml", tune],
                      None, recipe="python scripts/train_models.py --models reader --name tiny")
    assert card.startswith("# reader-tiny\n") and "| all | " in card and "answer_exact" in card
    assert "load_model(\"checkpoints/reader-tiny\")" in card and "--models reader --name tiny" in card
    assert "## Command\n```\nnice accelerate launch train.py --config configs/reader.yaml\n" + tune + "\n```\n" in card
    last = model_card("tiny", "reader", out, ["train.py"], None, installed="last")
    assert "installed: the last, step 30" in last and "## Metrics (last checkpoint, " in last


# -- reading a method's pool: windows, answer types, effrag eval --reader ----------------------------------------
@pytest.fixture(scope="module")
def reader_dir(data, tmp_path_factory) -> Path:
    """An (untrained) reader checkpoint on the tiny encoder: reading is deterministic, which is all these tests need."""
    out = tmp_path_factory.mktemp("reader_ckpt")
    ExtractiveReader.from_encoder(data["base"], options={"max_length": 96}).save_pretrained(out)
    return out


def test_pack_fills_windows_in_rank_order_within_the_reader_length(reader_dir):
    reader = ExtractiveReader.from_pretrained(reader_dir)
    passages = [f"Title {i}: " + " ".join(["word"] * n) for i, n in enumerate([10, 30, 50, 5, 200, 3])]
    windows = reader.pack("which one?", passages)
    assert [i for w in windows for i in w] == list(range(len(passages)))  # every passage once, in order
    assert [4] in windows  # too long for any window: read alone
    q_len = len(reader.tokenizer("which one?", add_special_tokens=False)["input_ids"])
    for w in windows:
        if len(w) > 1:
            n = sum(len(reader.tokenizer(passages[i], add_special_tokens=False)["input_ids"]) + 1 for i in w)
            assert q_len + n + 3 <= reader.max_length
    assert reader.pack("which one?", passages, together=False) == [[i] for i in range(len(passages))]
    answer, window = reader.read("which one?", passages)
    assert window in windows and answer.answer_type in ("span", "yes", "no")
    assert answer.answer == (answer.text if answer.answer_type == "span" else answer.answer_type)
    empty, none = reader.read("which one?", [])
    assert none == [] and empty.answer == ""


def test_eval_reader_answers_the_pool_of_any_retrieval_method(reader_dir, tmp_path):
    from effrag.cli import main
    from effrag.data import build_corpus
    from effrag.pipelines import build_pipeline
    from effrag.pipelines.generation import ReaderGenerator
    from effrag.retrieval import build_retriever
    from effrag.tuning import model_fingerprint

    dev, train = sample_path("hotpotqa", "dev"), sample_path("hotpotqa", "train")
    argv = ["eval", "--method", "direct-r", "--reader", str(reader_dir), "--questions", str(dev), "--corpus-from",
            str(train), "--retriever", "bm25", "--k", "4", "--limit", "3", "--output", str(tmp_path / "out")]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())[0]
    config = json.loads((tmp_path / "out" / "config.json").read_text())["run"]
    assert config["reader"] == {"path": str(reader_dir), "mode": "together", "context": "chunks",
                                "model": model_fingerprint(reader_dir, with_options=True)}
    assert len(rows) == 3 and all(r["llm_calls"] == 0 for r in rows) and "em" in metrics and "f1" in metrics
    # the same answers as the reader on the same pools, outside the CLI
    retriever = build_retriever("bm25", build_corpus([train, dev]))
    pipe = build_pipeline("direct-r", retriever, k=4, generator=ReaderGenerator(str(reader_dir)))
    from effrag.data import load_questions

    again = pipe.run_batch([q.question for q in load_questions(dev, limit=3)])
    assert [r["answer"] for r in rows] == [r.answer for r in again]
    assert all(r["retrieved"] == a.ids for r, a in zip(rows, again))


def _eval_error(argv: list, capsys) -> str:
    from effrag.cli import main

    capsys.readouterr()  # drop what the test itself printed
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_reader_dirs_and_uses_are_one_line_errors(reader_dir, data, tmp_path, capsys):
    base = ["eval", "--questions", sample_path("hotpotqa", "dev"), "--corpus-from", sample_path("hotpotqa", "train"),
            "--retriever", "bm25", "--output", tmp_path / "o"]
    err = _eval_error(base + ["--method", "direct-r", "--reader", tmp_path / "nope"], capsys)
    assert "nope" in err and "heads.safetensors" in err
    other = tmp_path / "labeler"
    from effrag.models import LabelerModel

    LabelerModel.from_encoder(data["base"]).save_pretrained(other)  # a checkpoint, but not a reader
    err = _eval_error(base + ["--method", "direct-r", "--reader", other], capsys)
    assert "model_type is 'labeler', expected 'reader'" in err
    err = _eval_error(base + ["--method", "cot", "--reader", reader_dir], capsys)
    assert "answers with its LLM" in err and "direct-r" in err
    err = _eval_error(base + ["--method", "direct-r", "--reader", reader_dir, "--llm", "default"], capsys)
    assert "--llm or --reader" in err


# -- span decoding: question echoes, length, tuning on dev -------------------------------------------------------
def _window(document: str, start: list[float], end: list[float]):
    """A WindowLogits over ``document``'s words: token i is word i (no question tokens)."""
    import re

    import torch

    from effrag.models.reader import WindowLogits

    spans = [m.span() for m in re.finditer(r"\S+", document)]
    return WindowLogits(document, torch.tensor(start), torch.tensor(end), torch.ones(len(spans), dtype=torch.bool),
                        torch.tensor(spans), 0.5, torch.tensor([1.0, -1.0, 0.0]))


def test_decoding_penalises_question_echoes_and_long_spans():
    from effrag.models.reader import decode_span, echoes_question

    q = "What is the scientific name of the creature featured in Creature from the Black Lagoon?"
    assert echoes_question("the Black Lagoon", q) and echoes_question("Creature.", q)
    assert not echoes_question("Eucritta", q) and not echoes_question("", q)
    assert not echoes_question("Bodyjar", "Which band formed earlier, Audioslave or Bodyjar?")  # alternatives
    assert not echoes_question("Bodyjar", "Between Audioslave and Bodyjar, which formed earlier?")

    doc = "Lagoon features Eucritta melanolimnetes today"
    # spans of at most 2 tokens: "Lagoon" (token 0) scores 10, "Eucritta melanolimnetes" (2-3) 7.5, "Eucritta" 7
    w = _window(doc, [5.0, 0.0, 4.0, 0.0, -1.0], [5.0, 0.0, 3.0, 3.5, -1.0])
    two = {"max_answer_tokens": 2}
    assert decode_span(q, w).text == "Lagoon"  # plain argmax
    assert decode_span(q, w, **two).text == "Lagoon"
    echo = decode_span(q, w, question_echo_penalty=10.0, **two)
    assert echo.text == "Eucritta melanolimnetes" and echo.span_score == pytest.approx(7.5)
    assert decode_span(q, w, question_echo_penalty=1.0, **two).text == "Lagoon"  # 10 - 1 still beats 7.5
    assert decode_span(q, w, question_echo_penalty=10.0, length_penalty=1.0, **two).text == "Eucritta"  # 7 > 6.5
    assert decode_span(q, w, question_echo_penalty=10.0, max_answer_tokens=1).text == "Eucritta"
    assert decode_span("Which is it, Lagoon or Eucritta?", w, question_echo_penalty=10.0, **two).text == "Lagoon"
    # the answer type: the type head's argmax, "yes" raised by yes_bias
    assert decode_span(q, w).answer_type == "span" and decode_span(q, w, yes_bias=1.5).answer_type == "span"
    assert decode_span(q, w, yes_bias=2.5).answer == "yes"


@pytest.mark.slow
def test_tune_reader_stores_the_best_decoding_in_the_checkpoint(reader_dir, tmp_path):
    """scripts/tune_reader.py end to end (the script is under test: its report and --write), then the reader it
    wrote and scripts/eval_reader.py over it."""
    import shutil

    from effrag.models.reader import DECODING_DEFAULTS

    ckpt = tmp_path / "reader"
    shutil.copytree(reader_dir, ckpt)
    data = sample_path("hotpotqa", "dev").parent.parent
    out = tmp_path / "tuned"
    argv = ["--reader", str(ckpt), "--data", str(data), "--limit", "4", "--echo-penalties", "0,100",
            "--length-penalties", "0,0.5", "--max-answer-tokens", "5,30", "--yes-biases", "0", "--write", "--output", str(out)]
    proc = run_script("tune_reader", *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert len(report["grid"]) == 8 and report["checkpoint_before"]["settings"] == DECODING_DEFAULTS
    best = report["best"]
    assert best["f1"] == max(r["f1"] for r in report["grid"])
    assert best["f1"] == pytest.approx(sum(d["f1"] for d in best["datasets"].values()) / 3)  # 4 questions each
    assert set(best["datasets"]) == set(DATASETS) and all(d["n"] == 4 for d in best["datasets"].values())
    tuned = ExtractiveReader.from_pretrained(ckpt)  # weights untouched, integrity check passes
    assert tuned.decoding() == best["settings"]
    assert json.loads((ckpt / "effrag_config.json").read_text())["decoding_tuned"]["f1"] == round(best["f1"], 2)
    assert "best (chosen)" in (out / "report.md").read_text()
    # the tuned settings are what the reader uses; explicit arguments still win
    q, doc = "Which band?", "Bodyjar: Bodyjar is a band from Australia formed in 1994."
    assert tuned.predict([q], [doc])[0] == tuned.predict([q], [doc], **best["settings"])[0]
    with pytest.raises(ValueError, match="unknown decoding setting"):
        tuned.predict([q], [doc], beam=3)
    # oracle reading reports the settings it decoded with
    proc = run_script("eval_reader", "--reader", ckpt, "--data", data, "--limit", "3", "--output", tmp_path / "oracle")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "oracle" / "results.json").read_text())
    assert results["decoding"] == best["settings"] and results["results"]["musique"]["n"] == 3


def test_eval_never_resumes_answers_of_a_retuned_reader(reader_dir, tmp_path, capsys):
    import shutil

    from effrag.cli import main
    from effrag.tuning.reader import store_decoding

    ckpt = tmp_path / "reader"
    shutil.copytree(reader_dir, ckpt)
    argv = ["eval", "--method", "direct-r", "--reader", ckpt, "--questions", sample_path("hotpotqa", "dev"),
            "--corpus-from", sample_path("hotpotqa", "train"), "--retriever", "bm25", "--k", "4", "--limit", "2",
            "--output", tmp_path / "out"]
    assert main([str(a) for a in argv]) == 0
    assert main([str(a) for a in argv]) == 0  # the same reader: resumes (nothing left to do)
    store_decoding(ckpt, {"question_echo_penalty": 3.0}, {"command": "test"})
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2  # new decoding, same path: the old answers are not the new reader's
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("effrag: error")]
    assert len(err) == 1 and "holds predictions of a different run (differs in: reader)" in err[0]


def test_banded_span_search_is_exact_and_shared_by_decoding():
    import itertools

    import torch

    from effrag.models.reader import WindowLogits, decode_span
    from effrag.models.spans import best_spans

    torch.manual_seed(0)
    start, end = torch.randn(4, 12), torch.randn(4, 12)
    allowed = torch.rand(4, 12) > 0.3
    allowed[3] = False  # a row without any allowed token
    b_s, b_e, score = best_spans(start, end, allowed, max_answer_tokens=4)
    for b in range(3):  # brute force over every pair
        pairs = [(s, e) for s, e in itertools.product(range(12), repeat=2)
                 if s <= e < s + 4 and allowed[b, s] and allowed[b, e]]
        s, e = max(pairs, key=lambda p: float(start[b, p[0]] + end[b, p[1]]))
        assert (int(b_s[b]), int(b_e[b])) == (s, e) and float(score[b]) == pytest.approx(float(start[b, s] + end[b, e]))
    assert score[3] == float("-inf")
    doc = " ".join(f"w{i}" for i in range(12))
    offsets = torch.tensor([[3 * i, 3 * i + 2] if i < 10 else [3 * i + (i - 10), 3 * i + (i - 10) + 3]
                            for i in range(12)])
    w = WindowLogits(doc, start[0], end[0], allowed[0], offsets, 0.0, torch.tensor([1.0, 0.0, 0.0]))
    ans = decode_span("q?", w, max_answer_tokens=4)  # no penalties: the same span as the batched search
    assert (ans.start, ans.end) == (int(offsets[b_s[0], 0]), int(offsets[b_e[0], 1]))
    assert ans.span_score == pytest.approx(float(score[0]))
