"""IRRR's loop and pipeline: the stopping rule, the first step's depth and the return fill, its reader answering
other methods' chunks, ``effrag irrr-data`` / ``effrag eval --method irrr``, BM25's article score and the thresholds'
tuning (:mod:`effrag.tuning.irrr`).

Models are tiny ELECTRAs (tests/helpers.py) with a rigged reader where a test needs a fixed decision; BM25 is real.
"""
from __future__ import annotations

import json

import pytest
from helpers import make_base, rigged_irrr

from effrag.data import Corpus, Passage, load_questions, sample_path
from effrag.models.irrr import NOANSWER, YES
from effrag.pipelines.irrr import IRRRConfig, IRRRPipeline, IRRRRunner, outcome
from effrag.pretrained import NAMES, NotShippedError
from effrag.retrieval.bm25 import BM25Retriever

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def electra(tmp_path_factory) -> str:
    return make_base("electra", tmp_path_factory.mktemp("irrr_loop") / "electra")


# -- the loop -------------------------------------------------------------------------------------
def test_loop_stops_when_answerable_and_at_path_cap(electra, sample_corpus):
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    qs = [q.question for q in load_questions(sample_path("hotpotqa", "dev"), limit=3)]

    never = IRRRRunner(rigged_irrr(electra, NOANSWER), bm25, IRRRConfig(k=3, max_path=3, answer_threshold=0.0))
    for r in never.run(qs):
        assert r["steps"][-1]["stop"] == "path cap" and r["iterations"] == 3
        assert len({*r["retrieved"]}) == len(r["retrieved"]) and len(r["retrieved"]) >= 3
        assert r["paragraphs_read"] == sum(len(s["candidates"]) for s in r["steps"]) <= 9
        path = [s["appended"] for s in r["steps"]]
        assert len(set(path)) == 3 and set(path) <= set(r["retrieved"])  # reranker's picks, never repeated
        assert all(s["query"] for s in r["steps"])

    now = IRRRRunner(rigged_irrr(electra, YES), bm25, IRRRConfig(k=3, max_path=3, answer_threshold=0.0))
    res = now.run(qs)
    for r in res:
        assert r["iterations"] == 1 and r["steps"][0]["stop"] == "answerable" and r["answer"] == "yes"
        assert len(r["retrieved"]) == 1  # the paragraph it answered from
    # questions in a batch move in lockstep; results equal one-at-a-time runs
    assert [now.run([q])[0]["retrieved"] for q in qs] == [r["retrieved"] for r in res]

    # a threshold nothing reaches: runs to the cap and returns the best answer read
    high = IRRRRunner(rigged_irrr(electra, YES), bm25, IRRRConfig(k=2, max_path=2, answer_threshold=1e9))
    r = high.run(qs[:1])[0]
    assert r["iterations"] == 2 and r["steps"][-1]["stop"] == "path cap" and r["answer"] == "yes"


def test_first_k_reads_deeper_and_return_k_fills_by_reranker(electra, sample_corpus):
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    qs = [q.question for q in load_questions(sample_path("hotpotqa", "dev"), limit=2)]
    cfg = IRRRConfig(k=2, first_k=4, max_path=2, answer_threshold=1e9, return_k=5)
    for r in IRRRRunner(rigged_irrr(electra, NOANSWER), bm25, cfg).run(qs):
        first, second = r["steps"]
        assert len(first["candidates"]) == 4 and len(second["candidates"]) == 2
        rank = {}
        for st in r["steps"]:
            for cid, score in zip(st["candidates"], st["rerank"]):
                rank[cid] = max(score, rank.get(cid, float("-inf")))
        # a paragraph read again at step 2 (with the longer path) counts once
        n = min(5, len(rank))
        assert len(r["retrieved"]) == n and len(set(r["retrieved"])) == n and set(r["retrieved"]) <= set(rank)
        paper = outcome(r["steps"])["retrieved"]  # the path and the answer's paragraph come first
        assert {first["appended"], second["appended"]} <= set(paper) and r["retrieved"][:len(paper)] == paper
        fill = r["retrieved"][len(paper):]
        assert [rank[c] for c in fill] == sorted((rank[c] for c in fill), reverse=True)
        left_out = set(rank) - set(r["retrieved"])
        assert fill and all(rank[c] <= min(rank[f] for f in fill) for c in left_out)
    # without return_k the paper's output: the path and the answer's paragraph only
    plain = IRRRRunner(rigged_irrr(electra, NOANSWER), bm25, IRRRConfig(k=2, first_k=4, max_path=2, answer_threshold=1e9))
    assert all(len(r["retrieved"]) <= 3 for r in plain.run(qs))
    with pytest.raises(ValueError, match="return_k"):
        IRRRConfig(return_k=0)


def test_outcome_cuts_and_fills_from_the_trace():
    steps = [{"candidates": ["a", "b", "c"], "rerank": [0.1, 2.0, -1.0], "appended": "b",
              "best": {"id": "a", "answer": "x", "answerability": -3.0}},
             {"candidates": ["d", "a"], "rerank": [0.5, 3.0],
              "best": {"id": "d", "answer": "y", "answerability": 1.0}, "stop": "answerable"}]
    assert outcome(steps)["retrieved"] == ["b", "d"]
    assert outcome(steps, return_k=4) == {"retrieved": ["b", "d", "a", "c"], "answer": "y", "answerability": 1.0}
    assert outcome(steps, return_k=1)["retrieved"] == ["b"]
    # retrieval order: step 1's candidates in the retriever's order before step 2's, whatever the reranker says
    steps[1]["candidates"], steps[1]["rerank"] = ["e", "a"], [9.0, 3.0]
    assert outcome(steps, return_k=4, fill_order="retrieval")["retrieved"] == ["b", "d", "a", "c"]
    assert outcome(steps, return_k=4, fill_order="rerank")["retrieved"] == ["b", "d", "e", "a"]
    with pytest.raises(ValueError, match="fill_order"):
        outcome(steps, return_k=4, fill_order="best")
    with pytest.raises(ValueError, match="fill_order"):
        IRRRConfig(fill_order="best")


def test_reader_answers_other_methods_chunks(electra, sample_corpus):
    """IRRRReader (a Direct-R / EfficientRAG generator) reads each chunk alone and keeps the most answerable."""
    from effrag.models.irrr import IRRRReader

    model = rigged_irrr(electra, YES).train()
    hits = BM25Retriever(sample_corpus, show_progress=False).search(["Who directed the film?"], 3)[0]
    encs = [model.encode("Who directed the film?", [{"title": h.title, "text": h.text}]) for h in hits]
    scores = model.predict(encs, batch_size=2)
    assert model.training  # predict runs in eval mode and restores the caller's mode
    reads = [model.read(e, s) for e, s in zip(encs, scores)]
    assert [r["rank"] for r in reads] == [s.rank for s in scores] and {r["answer"] for r in reads} == {"yes"}
    out = IRRRReader(model)("Who directed the film?", hits)
    best = max(range(len(reads)), key=lambda i: reads[i]["answerability"])
    assert out["answer"] == "yes" and out["llm_calls"] == 0 and out["trace"]["chunk"] == hits[best].id
    assert IRRRReader(model)("Who directed the film?", []) == {"answer": "", "llm_calls": 0}


def test_pipeline_output_and_options(electra, sample_corpus, tmp_path):
    model = rigged_irrr(electra, NOANSWER)
    model.save_pretrained(tmp_path / "m")
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    p = IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"), k=2, irrr_max_path=2)
    assert p.config.k == 2 and p.config.max_path == 2
    out = p.run("Who directed the film?").to_row()  # as predictions.jsonl records it
    assert set(out) >= {"retrieved", "scores", "answer", "iterations", "trace", "paragraphs_read", "timing"}
    assert out["llm_calls"] == 0 and len(out["scores"]) == len(out["retrieved"])
    with pytest.raises(ValueError, match="unknown IRRR option"):
        IRRRPipeline(bm25, irrr_model=model, bogus=1)
    if "irrr-all" not in NAMES:  # the default is the shipped irrr-all: until it ships, one line with the command
        with pytest.raises(NotShippedError, match="irrr-all .*not shipped.*train_models.py --models irrr"):
            IRRRPipeline(bm25)
    # a generator (effrag eval --reader / --llm) answers IRRR's paragraphs; IRRR's own answer stays beside it
    seen = []

    def generator(question, chunks):
        seen.append([c.id for c in chunks])
        return {"answer": "from the generator", "llm_calls": 0, "trace": {"reader": "test"}}

    read = IRRRPipeline(bm25, irrr_model=model, k=2, irrr_max_path=2, generator=generator).run("Who directed the film?")
    row = read.to_row()
    assert row["answer"] == "from the generator" and row["irrr_answer"] == out["answer"]
    assert seen == [row["retrieved"]] and row["generation"] == {"reader": "test"} and row["llm_calls"] == 0


def test_cli_irrr_data_and_eval(electra, tmp_path, capsys):
    from effrag.cli import main

    hp_train, hp_dev = str(sample_path("hotpotqa", "train")), str(sample_path("hotpotqa", "dev"))
    assert main(["irrr-data", "--inputs", hp_train, "--limit", "3", "--output", str(tmp_path / "d"), "--quiet"]) == 0
    recs = [json.loads(line) for line in (tmp_path / "d" / "irrr.jsonl").read_text().splitlines()]
    assert {r["qid"] for r in recs} == {q.id for q in load_questions(hp_train, limit=3)}
    assert json.loads((tmp_path / "d" / "build_config.json").read_text())["candidates"] == 5
    assert main(["irrr-data", "--inputs", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "x")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err

    rigged_irrr(electra, NOANSWER).save_pretrained(tmp_path / "m")
    assert main(["eval", "--method", "irrr", "--irrr-model", str(tmp_path / "m"), "--irrr-max-path", "2",
                 "--questions", hp_dev, "--corpus-from", hp_train, "--retriever", "bm25", "--k", "3",
                 "--limit", "2", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "e")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["iterations"] == 2 and r["paragraphs_read"] <= 6 for r in rows)
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())[0]
    assert m["method"] == "irrr" and 0 <= m["recall"] <= 1 and "f1" in m and "em" in m
    # --irrr-first-k reads deeper at step 1, --irrr-return-k returns a Direct-R-sized pool
    assert main(["eval", "--method", "irrr", "--irrr-model", str(tmp_path / "m"), "--irrr-max-path", "2",
                 "--irrr-first-k", "5", "--irrr-return-k", "6", "--irrr-fill-order", "retrieval",
                 "--questions", hp_dev, "--corpus-from", hp_train,
                 "--retriever", "bm25", "--k", "3", "--limit", "2", "--cache-dir", str(tmp_path / "cache"),
                 "--output", str(tmp_path / "f")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "f" / "predictions.jsonl").read_text().splitlines()]
    for r in rows:
        read = {c for step in r["trace"]["hops"] for c in step["candidates"]}
        assert len(r["trace"]["hops"][0]["candidates"]) == 5 and len(r["retrieved"]) == min(6, len(read)) > 3
        paper = outcome(r["trace"]["hops"])["retrieved"]  # the path and the answer's paragraph, then the fill
        assert r["retrieved"][:len(paper)] == paper
        fill = r["retrieved"][len(paper):]
        order = [c for st in r["trace"]["hops"] for c in st["candidates"]]  # retrieval order: step 1's candidates first
        assert fill == sorted(fill, key=order.index)


def test_bm25_article_option_is_appendix_b_score(tmp_path):
    """Paragraph BM25 + article score with IDF+^2 and b = 0; kept through save/load."""
    import math

    from effrag.retrieval import load_retriever

    ps = [Passage.make("Zorbland", "Zorbland is a country with rivers."), Passage.make("Zorbland", "Its capital is Quix."),
          *[Passage.make(f"Other {i}", f"Town {i} has a market.") for i in range(4)]]
    corpus = Corpus(ps)
    plain, art = BM25Retriever(corpus, show_progress=False), BM25Retriever(corpus, article=True, show_progress=False)
    # "zorbland" occurs twice in the Zorbland article (title + text); 5 articles, df 1; k1 = 1.2
    idf = math.log((5 - 1 + 0.5) / (1 + 0.5))
    extra = idf ** 2 * 2 * 2.2 / (2 + 1.2)
    s_plain, s_art = plain.scores("zorbland"), art.scores("zorbland")
    assert s_art[1] - s_plain[1] == pytest.approx(extra, rel=1e-4)  # "Its capital is Quix." gains via its article
    assert s_art[0] - s_plain[0] == pytest.approx(extra, rel=1e-4)
    assert s_art[2] == s_plain[2] == 0
    assert [h.id for h in art.search(["zorbland capital"], 2)[0]] == [ps[1].id, ps[0].id]
    art.save(tmp_path / "idx")
    loaded = load_retriever(tmp_path / "idx")
    assert loaded.opts["article"] is True and list(loaded.scores("zorbland")) == pytest.approx(list(s_art))


def test_tune_irrr_replays_thresholds_and_return_k(electra, tmp_path):
    """effrag.tuning.irrr (scripts/tune_irrr.py): one run to the cap per (query threshold, first_k), stops and
    fills replayed from it."""
    from effrag.data import sample_path as sp
    from effrag.models import IRRRModel
    from effrag.tuning.irrr import tune_irrr

    rigged_irrr(electra, NOANSWER).save_pretrained(tmp_path / "m")
    out = tmp_path / "t"
    model = IRRRModel.from_pretrained(tmp_path / "m").eval()

    def tune():
        return tune_irrr(model, sp("hotpotqa", "dev").parents[1], out, datasets=["hotpotqa"], limit=2,
                         query_thresholds=[0.3], first_ks=[4], k=2, max_path=2, answer_thresholds=[-100, 100],
                         return_k=5, fill_orders=["rerank", "retrieval"], objective="recall")

    assert tune()["config"] == json.loads((out / "best.json").read_text())
    grid = json.loads((out / "grid.json").read_text())["grid"]
    assert len(grid) == 4 and {e["fill_order"] for e in grid} == {"rerank", "retrieval"}
    never, first = (next(e for e in grid if e["answer_threshold"] == t and e["fill_order"] == "rerank")
                    for t in (100, -100))
    # stopped at step 1 nothing is left to order: both fills return the same
    first_retrieval = next(e for e in grid if e["answer_threshold"] == -100 and e["fill_order"] == "retrieval")
    assert first_retrieval["hotpotqa"] == first["hotpotqa"]
    # stops at once: the 4 read at step 1 are all returned (fewer than return_k)
    assert first["hotpotqa"]["steps"] == 1 and first["hotpotqa"]["read"] == first["hotpotqa"]["returned"] == 4
    runs = [json.loads(line) for line in (out / "runs_q0.3_fk4_k2_hotpotqa.jsonl").read_text().splitlines()]
    distinct = [len({c for st in r["steps"] for c in st["candidates"]}) for r in runs]  # step 2 may re-read one
    assert never["hotpotqa"]["steps"] == 2 and never["hotpotqa"]["read"] == 6
    assert never["hotpotqa"]["returned"] == sum(min(5, n) for n in distinct) / 2
    assert never["recall"] >= first["recall"]
    best = json.loads((out / "best.json").read_text())
    top = max(e["recall"] for e in grid)
    chosen = min((e for e in grid if round(e["recall"], 6) == round(top, 6)), key=lambda e: e["read"])
    assert best["answer_threshold"] == chosen["answer_threshold"] and best["return_k"] == 5
    assert {k: best[k] for k in ("query_threshold", "max_path", "k", "first_k")} == {
        "query_threshold": 0.3, "max_path": 2, "k": 2, "first_k": 4}
    assert best.get("fill_order", "rerank") in ("rerank", "retrieval")
    assert "hotpotqa recall" in (out / "table.md").read_text()
    assert tune()["grid"] == grid  # resumes: nothing rerun, same grid
    assert json.loads((out / "grid.json").read_text())["grid"] == grid


def test_irrr_config_file_configures_the_loop(electra, sample_corpus, tmp_path):
    """read_irrr_config (scripts/bench_qa.py --irrr-config): a tuner's best.json sets IRRR's loop; bad files are
    one-line errors naming the file."""
    from effrag.pipelines.irrr import read_irrr_config

    assert read_irrr_config(None) == {}
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"query_threshold": 0.15, "answer_threshold": -2.0, "max_path": 2, "k": 2,
                                "first_k": 4, "return_k": 5, "fill_order": "retrieval"}))
    config = read_irrr_config(best)
    p = IRRRPipeline(BM25Retriever(sample_corpus, show_progress=False), irrr_model=rigged_irrr(electra, NOANSWER),
                     config=config)
    assert (p.config.first_k, p.config.return_k, p.config.fill_order, p.config.answer_threshold) == (
        4, 5, "retrieval", -2.0)
    assert len(p.run("Who directed the film?").chunks) <= 5
    for text, why in (("[1, 2]", "expected a JSON object"), ("{oops", "cannot read a JSON object")):
        best.write_text(text)
        with pytest.raises(ValueError, match=f"^{best}: {why}"):
            read_irrr_config(best)
    best.write_text(json.dumps({"bogus": 1}))
    with pytest.raises(ValueError, match="unknown IRRR option"):
        IRRRPipeline(BM25Retriever(sample_corpus, show_progress=False), irrr_model=rigged_irrr(electra, NOANSWER),
                     config=read_irrr_config(best))


def test_a_model_folders_irrr_json_sets_the_loop_and_a_given_k_wins(electra, sample_corpus, tmp_path):
    """The shipped model's chosen options travel in its folder (irrr.json, scripts/irrr_report.py): a run that names
    the folder gets them, an explicit k or option overrides them, a damaged file is one error naming it."""
    rigged_irrr(electra, NOANSWER).save_pretrained(tmp_path / "m")
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    assert IRRRPipeline(bm25, irrr_model=str(tmp_path / "m")).config == IRRRConfig()  # no file: the paper's loop
    chosen = {"k": 3, "first_k": 6, "max_path": 2, "query_threshold": 0.15, "answer_threshold": 99.0,
              "return_k": 7, "fill_order": "retrieval"}
    (tmp_path / "m" / "irrr.json").write_text(json.dumps({"config": chosen, "chosen_on": {"n": {"hotpotqa": 5}}}))
    p = IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"))
    assert {key: getattr(p.config, key) for key in chosen} == chosen
    result = p.run("Who directed the film?")
    assert len(result.chunks) <= 7 and result.iterations == 2  # never answerable: the path grows to max_path
    assert len(result.hops[0]["candidates"]) == 6  # the first step read first_k
    p = IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"), k=2, irrr_return_k=4)
    assert (p.config.k, p.config.return_k, p.config.first_k) == (2, 4, 6)
    (tmp_path / "m" / "irrr.json").write_text(json.dumps({"config": {**chosen, "stop_at": 3}}))
    with pytest.raises(ValueError, match=r"irrr\.json: unknown IRRR option\(s\) \['stop_at'\]"):
        IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"))
    (tmp_path / "m" / "irrr.json").write_bytes(b'{"config": {"k": 3,')  # torn by a crash mid-write
    with pytest.raises(ValueError, match=r"irrr\.json: cannot read a JSON object"):
        IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"))


def test_irrr_crossfit_rows_score_the_replayed_paragraphs_at_every_cut():
    """effrag.tuning.irrr.crossfit_rows: each replayed config's returned paragraphs become the positions that
    effrag.tuning.crossfit cuts at any budget, so IRRR is chosen and scored held out as EfficientRAG is."""
    from effrag.evaluation.metrics import recall
    from effrag.tuning.crossfit import crossfit
    from effrag.tuning.irrr import crossfit_rows, replay

    def steps(gold_first: bool):
        return [{"candidates": ["g1", "x1", "x2"] if gold_first else ["x1", "x2", "x3"], "rerank": [0.1, 2.0, 1.0],
                 "appended": "x1", "best": {"id": "x1", "answer": "a", "answerability": -1.0}},
                {"candidates": ["g2", "x4"], "rerank": [3.0, 0.0], "appended": "g2",
                 "best": {"id": "g2", "answer": "b", "answerability": 2.0}}]

    rows = [{"qid": f"q{i}", "gold": ["g1", "g2"], "steps": steps(i % 2 == 0)} for i in range(10)]
    runs = {(0.3, None): {"ds": rows}}
    out = crossfit_rows(runs, [0.0, 99.0], ["rerank", "retrieval"], 4, k=3, max_path=2)["ds"]
    assert len(out) == 4 and all(len(r["per_question"]) == 10 for r in out)
    for r in out:
        c = r["config"]
        assert c["max_candidates"] == 4 and c["k"] == 3 and c["max_path"] == 2
        for pq, row in zip(r["per_question"], rows):
            _, ids, _, read = replay(row["steps"], c["answer_threshold"], 4, c["fill_order"])
            assert pq[0] == row["qid"] and pq[1] == 2 and pq[3] == len(ids) and pq[4] == [read, 0, 0]
            assert len(pq[2]) / 2 == recall(ids, row["gold"])  # every gold returned sits at a listed position
            assert all(ids[p - 1] in row["gold"] for p in pq[2])
    held = crossfit({"ds": out}, budgets=(2, 4), k=5)["datasets"]["ds"]
    assert held["n"] == 10 and 0.0 < held["recall"][4] <= 1.0 and held["recall"][2] <= held["recall"][4]


@pytest.mark.skipif("irrr-all" not in NAMES, reason="irrr-all is not exported into this install")
def test_the_shipped_irrr_all_runs_by_default_with_its_chosen_options(tmp_path, capsys):
    """``effrag eval --method irrr`` and ``effrag retrieve --method irrr`` with no model named run the shipped int8
    irrr-all with the options its irrr.json holds (chosen on the dev questions, cross-fitted)."""
    from helpers import run_cli

    from effrag.pretrained import pretrained_path

    shipped = pretrained_path("irrr-all")
    chosen = json.loads((shipped / "irrr.json").read_text())["config"]
    dev = sample_path("hotpotqa", "dev")
    code, _, err = run_cli(["eval", "--method", "irrr", "--questions", dev, "--corpus-from", dev, "--retriever", "bm25",
                            "--limit", 2, "--output", tmp_path / "out"], capsys)
    assert code == 0, err
    run = json.loads((tmp_path / "out" / "config.json").read_text())["run"]
    assert {key: run["method_config"][key] for key in chosen} == chosen
    assert run["model_files"]["irrr_model"]  # the shipped weights' fingerprint, recorded
    rows = [json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(0 < len(r["retrieved"]) <= (chosen.get("return_k") or 10) for r in rows)
    assert all(len(r["trace"]["hops"][0]["candidates"]) == (chosen.get("first_k") or chosen["k"]) for r in rows)
    code, _, err = run_cli(["corpus", "build", "--inputs", dev, "--output", tmp_path / "corpus.jsonl"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["index", "build", "--corpus", tmp_path / "corpus.jsonl", "--retriever", "bm25",
                            "--output", tmp_path / "idx"], capsys)
    assert code == 0, err
    q = load_questions(dev)[0].question
    code, out, err = run_cli(["retrieve", "--index", tmp_path / "idx", "--method", "irrr", "--json", q], capsys)
    assert code == 0, err
    (row,) = [json.loads(x) for x in out.splitlines()]
    assert row["question"] == q and 0 < len(row["chunks"]) <= (chosen.get("return_k") or 10)


def test_the_committed_irrr_evidence_rebuilds_its_table_and_the_shipped_choice(tmp_path):
    """reports/irrr/crossfit/table.md and the shipped irrr-all's irrr.json are recomputed from the repository alone
    (the committed per-question evidence, no model, no data folder)."""
    from pathlib import Path

    from helpers import run_script

    root = Path(__file__).resolve().parents[2]
    report = root / "reports" / "irrr" / "crossfit"
    proc = run_script("irrr_report", "--evidence", report / "evidence", "--output", tmp_path / "out",
                      "--system", tmp_path, "--data", tmp_path / "no-data")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "table.md").read_text() == (report / "table.md").read_text()
    rebuilt = json.loads((tmp_path / "irrr.json").read_text())
    shipped = json.loads((root / "effrag" / "pretrained" / "irrr-all" / "irrr.json").read_text())
    assert rebuilt == shipped


@pytest.mark.skipif("irrr-all" not in NAMES, reason="irrr-all is not exported into this install")
def test_irrr_report_runs_the_grid_resumes_and_refuses_too_few_questions(tmp_path):
    """scripts/irrr_report.py over the shipped model: the runs to the cap, evidence and irrr.json; a rerun reads
    the runs back (same choice); questions all in the bundled sample leave no fold to choose on: one line."""
    from helpers import run_script

    data = sample_path("hotpotqa", "dev").parents[1]
    base = ["--irrr", "irrr-all", "--data", data, "--datasets", "hotpotqa", "--limit", 3, "--query-thresholds", 0.3,
            "--answer-thresholds", -2, 99, "--runs", tmp_path / "runs", "--folds", 2, "--er-report", tmp_path / "none"]
    proc = run_script("irrr_report", *base, "--output", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "irrr_report: hotpotqa: 0 question(s) outside the bundled sample, fewer than the 2 folds (--keep-sample "
        "lets the sample's questions count)")
    assert len((tmp_path / "runs" / "runs_q0.3_fk10_k5_hotpotqa.jsonl").read_text().splitlines()) == 3  # kept
    for _ in range(2):
        proc = run_script("irrr_report", *base, "--keep-sample", "--output", tmp_path / "out", "--system", tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        chosen = json.loads((tmp_path / "irrr.json").read_text())
        assert chosen["config"]["query_threshold"] == 0.3 and chosen["config"]["answer_threshold"] in (-2, 99)
        assert chosen["chosen_on"]["n"] == {"hotpotqa": 3}
    assert (tmp_path / "out" / "evidence" / "hotpotqa.json.gz").is_file() and "hotpotqa (3)" in proc.stdout
