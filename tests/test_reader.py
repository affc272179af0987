"""The ``reader`` task: SearChain's extractive reader built from dataset files and trained by the one loop.

A tiny encoder from test_models.py (built in code, no download) on records of the bundled sample.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_models import make_base  # noqa: E402
from test_training import fresh_accelerate_state, reset_accelerate  # noqa: E402,F401  (autouse fixture)

from effrag.data import sample_path  # noqa: E402
from effrag.models import ExtractiveReader, load_model  # noqa: E402
from effrag.training import evaluate_only, load_config, train  # noqa: E402
from effrag.training.data import RecordError, read_jsonl  # noqa: E402
from effrag.training.tasks.reader import check_reader_record, write_reader_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("hotpotqa", "2wikimqa", "musique")


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
    answerable = [r for r in recs if r["answer_start"] is not None]
    assert len(answerable) == data["stats"]["answerable"] and 0 < len(answerable) < len(recs)
    assert {r["dataset"] for r in recs} == set(DATASETS)
    assert not any("#1" in r["question"] for r in recs if r["dataset"] == "musique")  # references resolved
    bad = {**answerable[0], "answer_start": answerable[0]["answer_start"] + 1}
    with pytest.raises(RecordError, match=r"x.jsonl:3: field 'answer' .* is not at context"):
        check_reader_record(bad, "x.jsonl:3")


def test_train_reader_reduces_loss_predicts_spans_and_round_trips(data, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("reader", {  # the packaged configs/reader.yaml, by name
        "model": {"name_or_path": data["base"], "max_length": 96},
        "data": {"train_file": data["train"], "eval_files": [data["dev"]]},
        "train": {"output_dir": str(out), "max_steps": 30, "batch_size": 8, "lr": 2e-3, "log_every": 1,
                  "mixed_precision": "no", "save_every": 0}})
    res = train(cfg)
    assert res["task"] == "reader" and res["global_step"] == 30 and res["metric_for_best"] == "span_exact"
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
    spec = importlib.util.spec_from_file_location("train_models", REPO / "scripts" / "train_models.py")
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    card = tm.model_card("tiny", "reader", out, ["accelerate", "launch", "train.py", "--config", "configs/reader.yaml"],
                         None, recipe="python scripts/train_models.py --models reader --name tiny")
    assert card.startswith("# reader-tiny\n") and "| all | " in card and "span_exact" in card
    assert "load_model(\"checkpoints/reader-tiny\")" in card and "--models reader --name tiny" in card
