"""Hugging Face ``datasets``: the HF layouts of real records load as the originals; synthesis writes a
DatasetDict and training reads it memory-mapped; predictions.jsonl loads with ``load_dataset("json")``.

Nothing can be downloaded here, so the HF layouts are made by converting the bundled real records
(:func:`effrag.data.hf_layouts.to_hf`, checked against the dataset cards' schemas in docs/datasets.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from effrag.data import Corpus, DataFormatError, load_questions, map_gold, sample_path  # noqa: E402
from effrag.data.hf_layouts import to_hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
datasets.disable_progress_bars()
WIKI = ("hotpotqa", "2wikimqa", "musique")


def _records(name: str, split: str = "dev") -> list[dict]:
    return [json.loads(x) for x in sample_path(name, split).read_text(encoding="utf-8").splitlines()]


def _hf(name: str, split: str = "dev", **kw):
    return datasets.Dataset.from_list([to_hf(r, name, **kw) for r in _records(name, split)])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Each dataset's HF layout saved as users have it: a DatasetDict on disk, parquet, JSONL, Arrow."""
    root = tmp_path_factory.mktemp("hf")
    for name in WIKI:
        dd = datasets.DatasetDict({"train": _hf(name, "train"), "validation": _hf(name)})
        dd.save_to_disk(str(root / name))
        dd["validation"].to_parquet(str(root / f"{name}.parquet"))
        dd["validation"].to_json(str(root / f"{name}.jsonl"))
    return root


def _as_json(questions) -> list[dict]:
    return [q.to_json() for q in questions]


@pytest.mark.parametrize("name", WIKI)
def test_every_layout_loads_to_the_same_records_gold_and_corpus_ids(name, saved):
    original = load_questions(sample_path(name, "dev"))
    ds = _hf(name)
    arrow = next((saved / name / "validation").glob("*.arrow"))
    sources = {
        "Dataset": ds, "DatasetDict split=": datasets.DatasetDict({"train": _hf(name, "train"), "validation": ds}),
        "DatasetDict one split": datasets.DatasetDict({"dev": ds}),
        "save_to_disk split folder": saved / name / "validation", "save_to_disk Dataset": None,
        "parquet": saved / f"{name}.parquet", "jsonl export": saved / f"{name}.jsonl", "arrow file": arrow,
    }
    sources["save_to_disk Dataset"] = saved / f"{name}-ds"
    ds.save_to_disk(str(sources["save_to_disk Dataset"]))
    if name == "musique":  # a Sequence-of-struct feature gives a dict of lists; a list feature a list of dicts
        sources["dict-of-lists columns"] = _hf(name, struct_of_lists=True)
        assert isinstance(sources["dict-of-lists columns"][0]["paragraphs"], dict)
    corpus = Corpus.from_questions(original)
    gold = map_gold(original, corpus)
    for label, src in sources.items():
        qs = load_questions(src, split="validation") if label == "DatasetDict split=" else load_questions(src)
        assert _as_json(qs) == _as_json(original), label
        assert Corpus.from_questions(qs).ids == corpus.ids, label
        assert map_gold(qs, corpus) == gold, label
    # the layouts read as the users' columns are really the HF ones (dataset cards)
    if name == "hotpotqa":
        assert isinstance(ds[0]["context"], dict) and set(ds[0]["context"]) == {"title", "sentences"}
        assert set(ds[0]["supporting_facts"]) == {"title", "sent_id"} and "id" in ds.column_names


def test_2wiki_variants_content_column_and_evidence_lists():
    recs = _records("2wikimqa")[:5]
    original = [q.to_json() for q in load_questions(sample_path("2wikimqa", "dev"), limit=5)]
    rows = []
    for r in recs:
        h = to_hf(r, "2wikimqa")
        h["context"] = {"title": h["context"]["title"], "content": h["context"]["sentences"]}  # ohjoonhee/2Wiki...
        h["evidences"] = [{"fact": s, "relation": p, "entity": o} for s, p, o in r["evidences"]]
        h["id"] = h.pop("_id")
        rows.append(h)
    assert _as_json(load_questions(datasets.Dataset.from_list(rows))) == original


def test_cli_corpus_and_eval_from_a_saved_hf_dataset(saved, tmp_path):
    from effrag.cli import main

    hf, orig = saved / "hotpotqa" / "validation", sample_path("hotpotqa", "dev")
    assert main(["corpus", "build", "--inputs", str(saved / "hotpotqa" / "train"), str(hf),
                 "--output", str(tmp_path / "c.jsonl")]) == 0
    assert main(["corpus", "build", "--inputs", str(sample_path("hotpotqa", "train")), str(orig),
                 "--output", str(tmp_path / "o.jsonl")]) == 0
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "o.jsonl").read_bytes()
    for label, q in (("hf", hf), ("orig", orig)):
        assert main(["eval", "--method", "direct-r", "--questions", str(q), "--corpus-from", str(q),
                     "--retriever", "bm25", "--k", "5", "--limit", "6", "--output", str(tmp_path / label)]) == 0
    pred = {k: (tmp_path / k / "predictions.jsonl").read_text().splitlines() for k in ("hf", "orig")}
    strip = [[{k: v for k, v in json.loads(x).items() if k != "latency_s"} for x in pred[k]] for k in pred]
    assert strip[0] == strip[1]
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "hf" / "predictions.jsonl"), split="train",
                               cache_dir=str(tmp_path / "hfcache"))
    assert len(ds) == 6 and ds.features["retrieved"] == datasets.List(datasets.Value("string"))


# -- bad input ----------------------------------------------------------------------------------
def test_missing_column_and_wrong_types_are_named(tmp_path):
    ds = _hf("hotpotqa")
    ds.remove_columns("context").save_to_disk(str(tmp_path / "noctx"))
    with pytest.raises(DataFormatError, match=r"noctx.*lacks column\(s\) 'context'"):
        load_questions(tmp_path / "noctx")
    with pytest.raises(DataFormatError, match=r"column\(s\) 'paragraphs' missing for the musique layout"):
        load_questions(_hf("musique").remove_columns("paragraphs"), dataset="musique")
    bad = [to_hf(r, "hotpotqa") for r in _records("hotpotqa")[:3]]
    bad[1]["supporting_facts"]["sent_id"] = [str(x) for x in bad[1]["supporting_facts"]["sent_id"]]
    with pytest.raises(DataFormatError, match=r"rows.jsonl:2: field 'supporting_facts.sent_id\[0\]': expected int, got str"):
        load_questions(_JsonlRows(tmp_path, bad))
    with pytest.raises(DataFormatError, match=r"<Dataset>\[0\]: field 'supporting_facts.sent_id\[0\]': expected int"):
        load_questions(datasets.Dataset.from_list(bad[1:2]))  # a string column in an Arrow table
    ctx = [to_hf(r, "hotpotqa") for r in _records("hotpotqa")[:2]]
    del ctx[0]["context"]["sentences"]
    with pytest.raises(DataFormatError, match=r"field 'context.sentences': missing"):
        load_questions(_JsonlRows(tmp_path, ctx))
    mus = _hf("musique", struct_of_lists=True).to_list()[:2]
    mus[1]["paragraphs"]["title"] = mus[1]["paragraphs"]["title"][:-1]
    with pytest.raises(DataFormatError, match=r"field 'paragraphs': its lists differ in length"):
        load_questions(_JsonlRows(tmp_path, mus))
    # skip_malformed counts the bad record and keeps the others
    qs, rep = load_questions(_JsonlRows(tmp_path, bad), skip_malformed=True, report=True)
    assert len(qs) == 2 and rep.skipped == 1 and "supporting_facts.sent_id" in rep.errors[0]


def _JsonlRows(tmp_path: Path, rows: list[dict]) -> Path:  # noqa: N802 - reads like a source
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_datasetdict_needs_a_split_and_datasets_is_needed_only_for_hf(saved, monkeypatch):
    with pytest.raises(ValueError, match=r"splits train, validation: choose one .*hotpotqa/validation"):
        load_questions(saved / "hotpotqa")
    with pytest.raises(ValueError, match="no split 'test'"):
        load_questions(saved / "hotpotqa", split="test")
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert load_questions(sample_path("hotpotqa", "dev"), limit=2)  # original formats need no datasets
    with pytest.raises(ImportError, match=r"needs the datasets package: pip install 'effrag\[datasets\]'"):
        load_questions(saved / "hotpotqa" / "validation")


# -- synthesis and training ------------------------------------------------------------------------
def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_synthesize_writes_a_datasetdict_resumably(saved, tmp_path):
    from effrag.cli import main

    base = ["synthesize", "--no-negatives", "--quiet", "--limit", "8"]
    hot, mus = str(saved / "hotpotqa" / "train"), str(sample_path("musique", "train"))
    assert main([*base, "--inputs", str(sample_path("hotpotqa", "train")), mus, "--output",
                 str(tmp_path / "jsonl")]) == 0
    assert main([*base, "--inputs", hot, mus, "--output", str(tmp_path / "both"), "--format", "both"]) == 0
    # arrow only, in two runs: the second resumes (skips hotpot) and adds musique to dataset/
    assert main([*base, "--inputs", hot, "--output", str(tmp_path / "arrow"), "--format", "arrow"]) == 0
    assert main([*base, "--inputs", hot, mus, "--output", str(tmp_path / "arrow"), "--format", "arrow"]) == 0
    for split in ("labeler", "filter"):
        want = _lines(tmp_path / "jsonl" / f"{split}.jsonl")
        assert want and _lines(tmp_path / "both" / f"{split}.jsonl") == want
        for out in ("both", "arrow"):
            ds = datasets.load_from_disk(str(tmp_path / out / "dataset"))[split]
            got = [{k: v for k, v in r.items() if v is not None} for r in ds]
            assert got == want, (out, split)
        assert (tmp_path / "arrow" / f"{split}.jsonl").read_text() == ""
    stats = [json.loads((tmp_path / d / "stats.json").read_text()) for d in ("jsonl", "arrow")]
    assert stats[0] == stats[1]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> dict:
    from helpers import copy_records, make_base

    root = tmp_path_factory.mktemp("arrowtrain")
    recs = copy_records(40)
    (root / "labeler.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    datasets.DatasetDict({"labeler": datasets.Dataset.from_list(recs)}).save_to_disk(str(root / "dd"))
    return {"root": root, "base": make_base("electra", root / "base"), "records": recs}


def _train(tiny_data: dict, train_file: Path, out: Path, **data) -> dict:
    from helpers import reset_accelerate

    from effrag.training import load_config, train

    reset_accelerate()
    cfg = load_config(None, {
        "task": "labeler", "model": {"name_or_path": tiny_data["base"], "max_length": 32, "head_dropout": 0.0},
        "data": {"train_file": str(train_file), "eval_files": [str(tiny_data["root"] / "labeler.jsonl")], **data},
        "train": {"output_dir": str(out), "batch_size": 4, "eval_batch_size": 8, "lr": 2e-3, "log_every": 2,
                  "mixed_precision": "no", "max_steps": 6, "torch_threads": 1, "eval_every": 6}})
    return train(cfg)


def test_training_from_arrow_matches_jsonl_and_caches_the_tokenisation(tiny_data, tmp_path):
    root = tiny_data["root"]
    a = _train(tiny_data, root / "labeler.jsonl", tmp_path / "jsonl", max_train_examples=30, sources=["annotation"])
    b = _train(tiny_data, root / "dd", tmp_path / "arrow", max_train_examples=30, sources=["annotation"])
    logs = [_lines(tmp_path / d / "log.jsonl") for d in ("jsonl", "arrow")]
    drop = ("time", "elapsed", "seconds", "examples_per_s", "steps_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in logs[0]] == \
        [{k: v for k, v in r.items() if k not in drop} for r in logs[1]]
    assert a["best_metric"] == b["best_metric"]
    cache = sorted((root / "dd" / "labeler").glob("effrag-labeler-*.arrow"))
    assert len(cache) == 1
    stamp = cache[0].stat().st_mtime_ns
    _train(tiny_data, root / "dd" / "labeler", tmp_path / "again", max_train_examples=30, sources=["annotation"])
    assert cache[0].stat().st_mtime_ns == stamp  # the second run read the cached features
    info = json.loads((tmp_path / "arrow" / "run_info.json").read_text())
    assert info["data_arrow"][str(root / "dd")]["rows"] == 40


def test_bad_arrow_training_record_names_row_and_field(tiny_data, tmp_path):
    from effrag.training.data import RecordError

    recs = [dict(r) for r in tiny_data["records"][:10]]
    recs[7]["tag"] = 2
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(RecordError, match=r"bad\[7\]: field 'tag' must be 0"):
        _train(tiny_data, tmp_path / "bad", tmp_path / "out")


# -- results as datasets -------------------------------------------------------------------------
def _signature(value):
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        sigs = {json.dumps(_signature(v)) for v in value if v is not None}
        assert len(sigs) <= 1, f"mixed types in a list: {sigs}"
        return ["list", json.loads(sigs.pop()) if sigs else None]
    return {k: _signature(v) for k, v in sorted(value.items())}


def _merge(a, b, where):
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k), f"{where}.{k}") for k in sorted(set(a) | set(b))}
    if isinstance(a, list) and isinstance(b, list):
        return ["list", _merge(a[1], b[1], f"{where}[]")]
    assert a == b, f"column {where}: mixed types {a} / {b}"
    return a


def test_predictions_load_with_datasets_typed_and_null_where_absent(tiny_efficientrag_dirs, saved, tmp_path):
    from effrag.cli import main

    q = saved / "musique" / "validation"
    argv = ["eval", "--method", "efficientrag", "--questions", str(q), "--corpus-from", str(q),
            "--retriever", "bm25", "--output", str(tmp_path / "er"), "--limit", "8",
            "--labeler", str(tiny_efficientrag_dirs["labeler"]), "--filter", str(tiny_efficientrag_dirs["filter"]),
            "--tag-threshold", "0.5", "--max-hops", "3", "--hop-k", "2"]
    assert main(argv) == 0
    path = tmp_path / "er" / "predictions.jsonl"
    rows = _lines(path)
    columns: dict = {}
    for r in rows:
        for k, v in r.items():
            columns[k] = _merge(columns.get(k), _signature(v), k)
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
    assert len(ds) == len(rows) == 8 and set(ds.column_names) == set(columns)
    for raw, row in zip(rows, ds):
        for k in ds.column_names:
            if k not in raw:
                assert row[k] is None, k
        assert row["retrieved"] == raw["retrieved"] and row["qid"] == raw["qid"]


def test_run_setup_takes_a_dataset_object(sample_corpus):
    from effrag.setup import RunSetup

    original = RunSetup.build(sample_path("musique", "dev"), limit=5, corpus=sample_corpus, retriever="bm25",
                              cache=False)
    from_hf = RunSetup.build(_hf("musique"), limit=5, corpus=sample_corpus, retriever="bm25", cache=False)
    assert _as_json(from_hf.questions) == _as_json(original.questions) and from_hf.gold == original.gold
