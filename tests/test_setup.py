"""The run-setup layer (``effrag.setup``): questions -> corpus -> retriever -> gold, the run identity and the one
resume check; the shared argument groups (``effrag.cli_args``)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from effrag.cli_args import add_method_args, add_run_args, method_options
from effrag.data import sample_path
from effrag.setup import RunSetup, default_cache_dir, open_corpus, retriever_options


def parse(argv: list[str], **kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_args(p, **kw)
    return p.parse_args(argv)


def test_from_args_pools_the_corpus_and_maps_gold(tmp_path):
    dev, train = sample_path("hotpotqa", "dev"), sample_path("hotpotqa", "train")
    args = parse(["--questions", str(dev), "--corpus-from", str(train), "--retriever", "bm25", "--limit", "5",
                  "--cache-dir", str(tmp_path)])
    setup = RunSetup.from_args(args)
    assert len(setup.questions) == 5 and setup.kind == "bm25" and setup.dataset == "hotpotqa"
    assert setup.missing_gold == 0 and setup.missing_gold_warning() is None
    ids = set(setup.corpus.ids) if hasattr(setup.corpus, "ids") else {p.id for p in setup.corpus}
    assert all(g and set(g) <= ids for g in setup.gold)  # every gold passage is a corpus id
    hits = setup.retriever.search(setup.texts[:1], 3)[0]
    assert len(hits) == 3 and all(h.id in ids for h in hits)
    desc = setup.identity()  # what was asked over what, and the schema of that record
    assert set(desc) == {"schema", "dataset", "questions", "corpus_from", "corpus", "index", "retriever",
                         "corpus_fingerprint", "corpus_size", "encoder"}
    assert desc["questions"] == str(dev.resolve()) and desc["corpus_size"] == len(setup.corpus)
    assert any(p.name.startswith("bm25-") for p in tmp_path.iterdir())  # the index went to --cache-dir


def test_gold_missing_from_the_corpus_counts_as_not_retrieved(tmp_path):
    corpus = open_corpus(corpus_from=[sample_path("musique", "dev")])
    setup = RunSetup.build(sample_path("hotpotqa", "dev"), limit=3, corpus=corpus, retriever="bm25", cache=False)
    assert setup.missing_gold > 0 and setup.gold_total >= setup.missing_gold
    assert all(any(g.startswith("missing:") for g in gold) for gold in setup.gold)
    assert "not in the corpus" in setup.missing_gold_warning()


def test_sample_is_seeded_and_kept_in_file_order():
    dev = sample_path("2wikimqa", "dev")
    a = RunSetup.build(dev, sample=5, seed=1, corpus_from=[dev], retriever="bm25", cache=False)
    b = RunSetup.build(dev, sample=5, seed=1, corpus_from=[dev], retriever="bm25", cache=False)
    c = RunSetup.build(dev, sample=5, seed=2, corpus_from=[dev], retriever="bm25", cache=False)
    assert [q.id for q in a.questions] == [q.id for q in b.questions] != [q.id for q in c.questions]
    assert [q.id for q in a.questions] == sorted(q.id for q in a.questions)


def test_a_built_retriever_and_corpus_are_used_as_given(sample_corpus):
    from effrag.retrieval import build_retriever

    bm25 = build_retriever("bm25", sample_corpus, show_progress=False)
    setup = RunSetup.build(sample_path("musique", "dev"), limit=2, corpus=sample_corpus, retriever=bm25)
    assert setup.retriever is bm25 and setup.corpus is sample_corpus and setup.kind == "bm25"


def test_saved_index_and_its_errors(tmp_path):
    from effrag.retrieval import build_retriever

    dev = sample_path("hotpotqa", "dev")
    corpus = open_corpus(corpus_from=[dev])
    build_retriever("bm25", corpus, show_progress=False).save(tmp_path / "idx")
    setup = RunSetup.build(dev, limit=2, index=tmp_path / "idx", retriever=None)
    assert setup.kind == "bm25" and len(setup.corpus) == len(corpus)
    with pytest.raises(ValueError, match="holds a bm25 index"):
        RunSetup.build(dev, limit=2, index=tmp_path / "idx", retriever="dense")


@pytest.mark.parametrize("kw, message", [
    ({"corpus_from": ["x"], "corpus": "y"}, "not both"),
    ({}, "no corpus"),
    ({"corpus_from": ["x"], "retriever": None}, "--retriever is required"),
])
def test_setup_errors_name_the_option(kw, message):
    kw = {"retriever": "bm25", **kw}
    with pytest.raises(ValueError, match=message):
        RunSetup.build(sample_path("hotpotqa", "dev"), limit=1, cache=False, **kw)


def test_retriever_options_and_cache_dir(monkeypatch, tmp_path):
    assert retriever_options("bm25") == {}
    assert retriever_options("dense", "hnsw") == {"index_type": "hnsw"}
    assert retriever_options("hybrid", bm25_article=True) == {"index_type": "flat", "article": True}
    with pytest.raises(ValueError, match="--bm25-article"):
        retriever_options("dense", bm25_article=True)
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "indexes"  # the cache root's indexes/, as every other folder is under it


def test_every_cache_folder_lives_under_one_root(monkeypatch, tmp_path):
    """``$EFFRAG_CACHE_DIR`` has one meaning (issue #72): the root of every folder effrag keeps between runs."""
    from effrag import paths
    from effrag.integrity import first_use_records
    from effrag.llm.cache import default_cache_path
    from effrag.models.backbones import backbones_root
    from effrag.models.late_vectors import default_root

    monkeypatch.delenv("EFFRAG_BACKBONES", raising=False)
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path))
    found = {default_cache_dir(), default_root(), backbones_root(), paths.llm_models_dir(), default_cache_path(),
             first_use_records()}
    assert {p.parent for p in found} == {tmp_path}
    assert {p.name for p in found} == {"indexes", "late-vectors", "backbones", "llm-models", "llm_cache.sqlite",
                                       "encoder-hashes.json"}
    monkeypatch.setenv("EFFRAG_BACKBONES", str(tmp_path / "elsewhere"))
    assert backbones_root() == tmp_path / "elsewhere"
    monkeypatch.delenv("EFFRAG_CACHE_DIR")
    assert paths.cache_root() == Path.home() / ".cache" / "effrag"


def test_method_args_are_collected_from_the_pipeline():
    p = argparse.ArgumentParser()
    add_run_args(p, sample=True)
    add_method_args(p, "efficientrag")
    args = p.parse_args(["--questions", "q.jsonl", "--labeler", "L", "--filter", "F", "--tag-threshold", "0.7",
                         "--n", "0"])
    opts = method_options(args)
    assert opts["labeler"] == "L" and opts["tag_threshold"] == 0.7 and opts["hop_k"] is None
    assert "questions" not in opts and "retriever" not in opts and args.n == 0


def test_result_log_resumes_cuts_a_torn_line_and_names_a_bad_one(tmp_path):
    from effrag.jsonl import ResultLog

    path = tmp_path / "results.jsonl"
    with ResultLog(path, key=lambda r: r["id"]) as log:
        log.append({"id": 1, "setup": "a"})
        log.extend([{"id": 2, "setup": "b"}, {"id": 3, "setup": "a"}])
    with path.open("a") as f:
        f.write('{"id": 4, "set')  # killed mid-write
    log = ResultLog(path, key=lambda r: r["id"], where=lambda r: r["setup"] == "a")
    assert log.torn and sorted(log.rows) == [1, 3] and 2 not in log and len(log) == 2
    log.append({"id": 4, "setup": "a"})
    log.close()
    assert path.read_text().count("\n") == 4 and path.read_text().endswith('"a"}\n')
    path.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"results.jsonl:2: invalid JSON"):
        ResultLog(path, key=lambda r: r["id"])


def test_own_contexts_makes_a_questions_file_its_own_corpus():
    dev = sample_path("musique", "dev")
    setup = RunSetup.build(dev, limit=3, retriever="bm25", cache=False, own_contexts=True)
    assert setup.missing_gold == 0 and setup.sources["corpus_from"] == []
    assert len(setup.corpus) == len(open_corpus(corpus_from=[dev]))


# ---------------------------------------------------------------------- one corpus, several question files; the identity
def test_a_setup_without_questions_asks_question_files_over_one_corpus(tmp_path):
    dev, train = sample_path("hotpotqa", "dev"), sample_path("2wikimqa", "dev")
    base = RunSetup.build(corpus_from=[dev, train], retriever="bm25", cache=False)
    assert base.questions == [] and base.dataset is None and base.identity()["questions"] is None
    hot, wiki = base.ask(dev, limit=3), base.ask(train, limit=2)
    assert (len(hot.questions), len(wiki.questions)) == (3, 2) and hot.retriever is wiki.retriever is base.retriever
    assert hot.identity()["questions"] == str(dev.resolve()) and wiki.dataset == "2wikimqa"
    assert hot.identity()["corpus_fingerprint"] == base.identity()["corpus_fingerprint"]
    direct = RunSetup.build(dev, limit=3, corpus_from=[dev, train], retriever="bm25", cache=False)
    assert direct.identity() == hot.identity() and direct.gold == hot.gold  # the same run either way
    other = hot.over("bm25", cache=False, bm25_article=True)
    assert other.questions is hot.questions and other.retriever is not hot.retriever and other.kind == "bm25"


def test_check_same_run_names_the_differing_keys_and_refuses_records_of_another_schema(tmp_path):
    from effrag.setup import IDENTITY_KEYS, IDENTITY_SCHEMA, check_same_run, same_run

    setup = RunSetup.build(sample_path("hotpotqa", "dev"), limit=2, retriever="bm25", own_contexts=True, cache=False)
    now = {**setup.identity(), "method": "direct-r", "k": [10]}
    check_same_run(None, now, tmp_path)  # nothing recorded: a fresh start
    check_same_run(dict(now), now, tmp_path)
    with pytest.raises(ValueError, match=r"holds predictions of a different run \(differs in: k, retriever\); x$"):
        check_same_run({**now, "k": [5], "retriever": "dense"}, now, tmp_path, what="predictions", hint="x")
    assert same_run({**now, "started": "then"}, now, may_change=["started"])
    assert same_run({**now, "limit": None}, now)  # a missing key reads as None
    assert not same_run({**now, "reader": "r"}, now)
    # a record written before the identity had its schema lacks some keys: it differs in them (a missing key reads
    # as None, as bm25's encoder is), and never resumes
    older = {k: v for k, v in now.items() if k not in ("schema", "corpus_size", "encoder")}
    assert set(IDENTITY_KEYS) >= {"schema", "corpus_size", "encoder"} and now["schema"] == IDENTITY_SCHEMA
    with pytest.raises(ValueError, match=r"differs in: corpus_size, schema\)"):
        check_same_run(older, now, tmp_path)
