"""Metrics on hand-computed cases, the pipeline registry, and the evaluation runner on real BM25."""
from __future__ import annotations

import json

import pytest

from effrag.data import Corpus, Passage, Question
from effrag.evaluation import cover_em, evaluate, exact_match, f1, markdown_table, normalize_answer, recall
from effrag.evaluation.metrics import answer_rule
from effrag.pipelines import Chunk, Pipeline, Result, build_pipeline, get_pipeline_class, register_pipeline
from effrag.retrieval import BM25Retriever


# ---------------------------------------------------------------- metrics
def test_recall_is_fraction_of_gold_found():
    assert recall(["a", "b", "c"], ["a", "d"]) == 0.5
    assert recall(["a", "d", "x"], ["a", "d"]) == 1.0
    assert recall([], ["a"]) == 0.0
    assert recall(["a", "a"], ["a", "a", "b"]) == 0.5  # distinct gold ids
    assert recall(["x"], []) == 1.0


def test_normalisation_drops_case_punctuation_articles_and_spaces():
    assert normalize_answer("  The  Eiffel-Tower, in Paris! ") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word


def test_exact_match_over_aliases():
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Beatles!", "The Beatles") == 1.0
    assert exact_match("Rolling Stones", ["Beatles", "The Fab Four"]) == 0.0
    assert exact_match("fab four", ["Beatles", "The Fab Four"]) == 1.0


def test_f1_token_overlap_takes_best_alias():
    # pred {barack, obama}, gold {barack, hussein, obama}: P=1, R=2/3, F1=0.8
    assert f1("Barack Obama", ["Barack Hussein Obama"]) == pytest.approx(0.8)
    assert f1("Barack Obama", ["Barack Hussein Obama", "Obama"]) == pytest.approx(0.8)
    assert f1("Obama", ["Barack Hussein Obama", "Obama"]) == 1.0
    assert f1("the a an", ["the"]) == 0.0  # both normalise to nothing
    assert f1("New York City", ["York"]) == pytest.approx(0.5)


def test_f1_yes_no_need_an_exact_match():
    assert f1("yes", ["yes"]) == 1.0
    assert f1("no", ["no way"]) == 0.0  # HotpotQA gives no partial credit around yes/no
    assert f1("yes it is", ["yes"]) == 0.0
    assert f1("No.", ["no"]) == 1.0


def test_cover_em_looks_for_gold_inside_prediction():
    assert cover_em("It was Christer Fuglesang, in 2006.", ["Christer Fuglesang"]) == 1.0
    assert cover_em("Fuglesang", ["Christer Fuglesang"]) == 0.0
    assert cover_em("The answer is: the Beatles", ["Beatles", "x"]) == 1.0
    assert cover_em("notable", ["no"]) == 0.0  # whole words only
    assert cover_em("anything", ["the"]) == 0.0  # an empty normalised gold covers nothing


# ---------------------------------------------------------------- registry
def test_registry_finds_direct_r_and_alias_and_reports_unknown():
    # the papers' names: Direct is the LLM alone (direct-llm kept as an alias), Direct-R retrieves
    assert get_pipeline_class("direct") is get_pipeline_class("direct-llm") is not get_pipeline_class("direct-r")
    assert get_pipeline_class("direct-r").__module__ == "effrag.pipelines.direct_r"
    with pytest.raises(ValueError, match="unknown method 'nope'.*direct-r"):
        get_pipeline_class("nope")


def test_a_new_method_registers_with_a_decorator(bm25):
    @register_pipeline("test-first-hit")
    class FirstHit(Pipeline):
        def __init__(self, retriever, k=1):
            self.retriever = retriever

        def run(self, question):
            [hits] = self.retriever.search([question], 1)
            return Result(question, [Chunk.from_hit(h) for h in hits], iterations=1)

    p = build_pipeline("test-first-hit", bm25)
    assert isinstance(p, FirstHit) and p.name == "test-first-hit"
    assert p.run_batch(["capital of France"])[0].ids == [PASSAGES["Paris"].id]


# ---------------------------------------------------------------- runner
PASSAGES = {t: Passage.make(t, x) for t, x in [
    ("Paris", "Paris is the capital of France."),
    ("France", "France is a country in Western Europe whose capital is Paris."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Germany", "Germany is a country in Central Europe."),
    ("Seine", "The Seine is a river that flows through Paris."),
    ("Rhine", "The Rhine is a river in Germany and other countries."),
]}


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever(Corpus(PASSAGES.values()), show_progress=False)


def _q(qid, text, answers, gold):
    return Question(id=qid, dataset="toy", question=text, answers=answers, gold=[PASSAGES[g] for g in gold])


QUESTIONS = [
    _q("q1", "Which river flows through the capital of France?", ["Seine"], ["Paris", "Seine"]),
    _q("q2", "What is the capital of Germany?", ["Berlin"], ["Berlin", "Germany"]),
    _q("q3", "Which river flows through Germany?", ["Rhine"], ["Rhine", "Germany"]),
]
GOLD = [q.gold_ids for q in QUESTIONS]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_runner_writes_predictions_and_per_k_metrics(tmp_path, bm25):
    pipe = build_pipeline("direct-r", bm25, k=3)
    entries = evaluate(pipe, QUESTIONS, GOLD, tmp_path, {"method": "direct-r"}, ks=[1, 3], show_progress=False)
    rows = _rows(tmp_path / "predictions.jsonl")
    assert [r["qid"] for r in rows] == ["q1", "q2", "q3"]
    for r, q in zip(rows, QUESTIONS):
        assert r["gold"] == q.gold_ids and r["answers"] == q.answers and r["question"] == q.question
        assert len(r["retrieved"]) == len(r["scores"]) == 3 and r["latency_s"] > 0
        assert r["llm_calls"] == 0 and "answer" not in r
    # recall is recomputed from the written rows, for each k
    for e in entries:
        expect = sum(recall(r["retrieved"][:e["k"]], r["gold"]) for r in rows) / 3
        assert e["recall"] == pytest.approx(expect)
        assert e["avg_chunks"] == e["k"] and e["n"] == 3 and e["dataset"] == "toy"
    assert entries[1]["recall"] >= entries[0]["recall"]
    assert json.loads((tmp_path / "metrics.json").read_text()) == entries
    md = (tmp_path / "metrics.md").read_text()
    assert md.startswith("| method | dataset | k | n | recall % |") and "direct-r" in md
    assert json.loads((tmp_path / "config.json").read_text())["run"] == {"method": "direct-r"}


def test_runner_resumes_and_skips_finished_questions(tmp_path, bm25):
    class Counting(Pipeline):
        name = "counting"
        slice_k = True

        def __init__(self, retriever):
            self.inner, self.seen = build_pipeline("direct-r", retriever, k=2), []

        def run(self, question):
            self.seen.append(question)
            return self.inner.run(question)

    first = Counting(bm25)
    evaluate(first, QUESTIONS[:2], GOLD[:2], tmp_path, {"m": 1}, ks=[2], show_progress=False)
    # a run killed in the middle of writing a row leaves a torn last line
    with (tmp_path / "predictions.jsonl").open("a") as f:
        f.write('{"qid": "q3", "retri')
    second = Counting(bm25)
    entries = evaluate(second, QUESTIONS, GOLD, tmp_path, {"m": 1, "limit": None}, ks=[2], show_progress=False)
    assert second.seen == [QUESTIONS[2].question]
    assert [r["qid"] for r in _rows(tmp_path / "predictions.jsonl")] == ["q1", "q2", "q3"]
    assert entries[0]["n"] == 3
    with pytest.raises(ValueError, match="different run.*differs in: m"):
        evaluate(Counting(bm25), QUESTIONS, GOLD, tmp_path, {"m": 2}, ks=[2], show_progress=False)


def test_answers_are_scored_when_a_generator_answers(tmp_path, bm25):
    def first_title(question, hits):
        return {"answer": hits[0].title, "prompt_tokens": 10, "completion_tokens": 2}

    pipe = build_pipeline("direct-r", bm25, k=2, generator=first_title)
    with pytest.raises(ValueError, match="several k"):
        evaluate(pipe, QUESTIONS, GOLD, tmp_path / "a", {}, ks=[1, 2], show_progress=False)
    [e] = evaluate(pipe, QUESTIONS, GOLD, tmp_path / "b", {}, ks=[2], show_progress=False)
    answers = [r["answer"] for r in _rows(tmp_path / "b" / "predictions.jsonl")]
    expect_em = sum(exact_match(a, q.answers) for a, q in zip(answers, QUESTIONS)) / 3
    assert e["em"] == pytest.approx(expect_em) and "f1" in e and "cover_em" in e
    assert e["answer_rule"] == answer_rule(QUESTIONS[0].dataset)  # metrics.json says which official rule scored F1
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())[0]["answer_rule"] == e["answer_rule"]
    [m] = evaluate(pipe, QUESTIONS, GOLD, tmp_path / "c", {"dataset": "musique"}, ks=[2], show_progress=False)
    assert m["answer_rule"] == "musique"
    assert m["f1"] == pytest.approx(sum(f1(a, q.answers, "musique") for a, q in zip(answers, QUESTIONS)) / 3)
    assert e["llm_calls"] == 1 and e["prompt_tokens"] == 10 and e["completion_tokens"] == 2


def test_questions_without_gold_have_no_recall(tmp_path, bm25):
    qs = [Question(id="b1", dataset="bamboogle", question="capital of France", answers=["Paris"])]
    [e] = evaluate(build_pipeline("direct-r", bm25, k=2), qs, [[]], tmp_path, {}, ks=[2], show_progress=False)
    assert e["recall"] is None and e["n_with_gold"] == 0


def test_markdown_table_formats_percentages_and_hides_zero_llm_cost():
    table = markdown_table([{"method": "m", "dataset": "d", "k": 5, "n": 2, "recall": 0.5, "avg_chunks": 5.0,
                             "latency_s": 0.01, "llm_calls": 0.0, "iterations": 1.0}])
    lines = table.splitlines()
    assert lines[0] == "| method | dataset | k | n | recall % | avg chunks | latency s/q | iterations |"
    assert lines[2] == "| m | d | 5 | 2 | 50.00 | 5.00 | 0.0100 | 1.00 |"


def test_f1_follows_each_datasets_official_rule():
    assert [answer_rule(d) for d in ("hotpotqa", "2wikimqa", "musique", "MuSiQue", None)] == \
        ["hotpotqa", "hotpotqa", "musique", "musique", "hotpotqa"]
    # HotpotQA (and 2Wiki): yes/no/noanswer get no partial credit; MuSiQue (SQuAD 2.0) has no special case
    assert f1("yes indeed", "yes") == 0.0
    assert f1("yes indeed", "yes", "musique") == pytest.approx(2 / 3)
    # both normalising to nothing: 1 under MuSiQue's rule, 0 under HotpotQA's
    assert f1("the", "a", "musique") == 1.0 and f1("the", "a") == 0.0
    assert f1("", "Paris", "musique") == 0.0
    assert f1("Paris France", ["Lyon", "Paris"], "musique") == f1("Paris France", ["Lyon", "Paris"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="unknown answer rule"):
        f1("a", "b", "squad3")


# ---------------------------------------------------------------- 2Wiki v1.1 answer aliases
def test_2wiki_alias_answer_scores_em_only_with_the_alias_file(tmp_path, bm25, capsys):
    """The official v1.1 script scores against the gold answer and the aliases + demonyms of answer_id."""
    import argparse

    from effrag.data import load_questions, sample_path
    from effrag.data.aliases import add_answer_alias_args, apply_aliases

    alias_file = tmp_path / "id_aliases.json"
    alias_file.write_text('{"Q_id": "Q1150195", "aliases": ["Samson and the Mighty Challenge"], '
                          '"demonyms": ["Samsonian"]}\n', "utf-8")

    def alias_answer(question, hits):
        return {"answer": "Samson and the Mighty Challenge"}

    def demonym_answer(question, hits):
        return {"answer": "samsonian"}

    parser = argparse.ArgumentParser()
    add_answer_alias_args(parser)
    results = {}
    for name, argv in {"without": [], "with": ["--aliases", str(alias_file)]}.items():
        args = parser.parse_args(argv)
        qs = load_questions(sample_path("2wikimqa"), limit=1)
        recorded = apply_aliases(args, qs)
        assert recorded == (str(alias_file.resolve()) if argv else None)
        for gen_name, gen in {"alias": alias_answer, "demonym": demonym_answer}.items():
            pipe = build_pipeline("direct-r", bm25, k=1, generator=gen)
            [e] = evaluate(pipe, qs, [[]], tmp_path / name / gen_name, {"answer_aliases": recorded}, ks=[1],
                           show_progress=False)
            results[name, gen_name] = (e["em"], e["f1"])
    assert results["without", "alias"][0] == 0.0 and results["without", "demonym"] == (0.0, 0.0)
    assert results["with", "alias"] == (1.0, 1.0) and results["with", "demonym"] == (1.0, 1.0)
    assert "answer aliases from" in capsys.readouterr().err
