"""Synthesis of EfficientRAG training data: annotation path, negatives, resumable output, stats."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_synthesis.align import align, content_keys, key_matches
from data_synthesis.annotation import annotate_question
from data_synthesis.negatives import context_negatives, mine_negatives, negative_queries
from data_synthesis.pipeline import synthesize
from data_synthesis.stats import compute_stats, format_table
from effrag.data import Corpus, load_questions, sample_path
from effrag.data.records import normalize_space
from effrag.jsonl import ResumableWriter, read_jsonl
from effrag.text import INFO, join_words, passage_text, words

REPO = Path(__file__).resolve().parents[2]
DATASETS = ("hotpotqa", "2wikimqa", "musique")


@pytest.fixture(scope="module")
def train():
    return {ds: load_questions(sample_path(ds, "train")) for ds in DATASETS}


@pytest.fixture(scope="module")
def annotated(train):
    return {ds: [(q, annotate_question(q)) for q in qs] for ds, qs in train.items()}


def _has_phrase(ws: list[str], labels: list[int], phrase: str) -> bool:
    """Are at least half of ``phrase``'s content words among the labeled words?"""
    want = content_keys(words(phrase))
    got = content_keys([w for w, l in zip(ws, labels) if l])
    return bool(want) and sum(key_matches(k, got) for k in want) >= len(want) / 2


# ------------------------------------------------------------------ annotation path

def test_every_sample_question_yields_well_formed_records(annotated):
    for ds, items in annotated.items():
        assert sum(bool(a.labeler) for _, a in items) == len(items), ds
        for q, a in items:
            gold = {p.id: p for p in q.gold}
            for r in a.labeler:
                assert r["qid"] == q.id and r["dataset"] == ds and r["source"] == "annotation"
                assert r["tag"] == 1 and r["chunk_id"] in gold and r["hop"] >= 1
                assert r["chunk_words"] == words(passage_text(gold[r["chunk_id"]]))
                assert len(r["labels"]) == len(r["chunk_words"]) and set(r["labels"]) <= {0, 1}
                assert 0 < sum(r["labels"]) < len(r["labels"])
            for f in a.filters:
                assert len(f["words"]) == len(f["labels"]) and any(f["labels"])
                assert INFO[0] in f["words"]
                assert f["target"] == join_words([w for w, l in zip(f["words"], f["labels"]) if l])
                assert align(f["words"], f["target"]).fraction == 1.0  # every target word is in the input
                assert not any(l for w, l in zip(f["words"], f["labels"]) if w == "Info")


def test_musique_hop1_chunks_keep_the_answer_and_filters_carry_the_bridge(annotated):
    checked = 0
    for q, a in annotated["musique"]:
        first = q.decomposition[0]
        chunk_id = q.gold[first.passage].id
        hop1 = [r for r in a.labeler if r["hop"] == 1 and r["chunk_id"] == chunk_id]
        assert hop1 and all(r["query"] == q.question for r in hop1)
        if _has_phrase(hop1[0]["chunk_words"], [1] * len(hop1[0]["chunk_words"]), first.answer):
            assert _has_phrase(hop1[0]["chunk_words"], hop1[0]["labels"], first.answer), q.id
            checked += 1
        if q.type == "2hop":
            f = [f for f in a.filters if f["hop"] == 1]
            assert len(f) == 1 and _has_phrase(words(f[0]["target"]), [1] * 99, first.answer), q.id
            # the hop-2 chunk is labeled under the filtered query and under the question
            hop2 = {r["query"] for r in a.labeler if r["hop"] == 2}
            assert hop2 == {f[0]["target"], q.question}
    assert checked >= 0.9 * len(annotated["musique"])


def test_musique_filter_drops_the_answered_part(annotated):
    q, a = next((q, a) for q, a in annotated["musique"] if "Signmark" in q.question)
    target = a.filters[0]["target"]
    assert "Finland" in target and "currency" in target and "Euro" in target
    assert "Signmark" not in target  # answered by hop 1: the bridge replaces it


def test_a_leading_relation_word_stays_in_the_next_query_and_a_trailing_one_does_not():
    """The query's start is not a dropped word: the outermost relation ("married") leads the question and
    belongs to the hop still to come; a trailing word closes the answered clause ("born") and goes."""
    from data_synthesis.annotation import Step, next_query_labels

    def target(query: str, answered: set[str], kept: list[str], bridge: str) -> str:
        done = Step(0, "", bridge, [], {k for k in content_keys(words(query)) if key_matches(k, answered)})
        todo = Step(1, "", "", [0], set())  # MuSiQue's sub-question names the relation differently
        src, labels, missing = next_query_labels(query, [kept], [done], [todo], [bridge])
        assert not missing
        return join_words([w for w, l in zip(src, labels) if l])

    q = target("Who was married to the creator of Fist Power?", content_keys(words("creator Fist Power")),
               words("Fist Power was created by Laura Knight ."), "Laura Knight")
    assert q.split()[:2] == ["Who", "was"] and "married" in q and "Laura Knight" in q
    assert "Fist" not in q and "creator" not in q
    q = target("What currency is used in the country where Signmark was born?",
               content_keys(words("country Signmark")), words("Signmark is from Finland ."), "Finland")
    assert "currency" in q and "Finland" in q and "born" not in q and "Signmark" not in q


def test_hotpotqa_bridge_and_comparison(annotated):
    for q, a in annotated["hotpotqa"]:
        hop1 = [r for r in a.labeler if r["hop"] == 1]
        assert all(r["query"] == q.question for r in hop1)
        if q.type == "comparison":  # both gold chunks are retrieved by the question
            assert {r["chunk_id"] for r in hop1} == set(q.gold_ids)
            kept = {r["chunk_id"]: [w for w, l in zip(r["chunk_words"], r["labels"]) if l] for r in hop1}
            for f in a.filters:  # partial info -> a query for the entity not yet covered
                info = f["words"][f["words"].index("Info") + 2:]
                (covered,) = [cid for cid, ws in kept.items() if ws == info]
                (other,) = [p for p in q.gold if p.id != covered]
                assert _has_phrase(words(f["target"]), [1] * 99, other.title.split(" (")[0]), q.id
        else:
            (f,) = [f for f in a.filters if f["hop"] == 1] or [None]
            if f is None:
                continue
            titles = [p.title.split(" (")[0] for p in q.gold]
            assert any(_has_phrase(words(f["target"]), [1] * 99, t) for t in titles), q.id
            assert {r["query"] for r in a.labeler if r["hop"] == 2} == {f["target"], q.question}
    filters = sum(len(a.filters) for _, a in annotated["hotpotqa"])
    assert filters >= len(annotated["hotpotqa"])  # every bridge gives one, every comparison two


def test_2wiki_triples_label_subject_and_object(train, annotated):
    q, a = next((q, a) for q, a in annotated["2wikimqa"] if "Reo Fortune" in q.question)
    hop1, hop2 = [r for r in a.labeler if r["hop"] == 1], [r for r in a.labeler if r["hop"] == 2]
    assert len(hop1) == 1 and _has_phrase(hop1[0]["chunk_words"], hop1[0]["labels"], "Margaret Mead")
    assert any(_has_phrase(r["chunk_words"], r["labels"], "New York") for r in hop2)
    (f,) = a.filters
    assert "Margaret Mead" in f["target"] and "death" in f["target"] and "Reo" not in f["target"]
    q, a = next((q, a) for q, a in annotated["2wikimqa"] if q.type == "comparison")
    assert {r["hop"] for r in a.labeler} == {1, 2} and len(a.filters) == 2
    assert {r["chunk_id"] for r in a.labeler if r["hop"] == 1} == set(q.gold_ids)


def test_unsupported_and_unannotated_questions_are_rejected(train):
    from data_synthesis.annotation import AnnotationReject

    bam = load_questions(sample_path("bamboogle", "dev"))[0]
    with pytest.raises(AnnotationReject, match="unsupported_dataset"):
        annotate_question(bam)
    q = train["musique"][0]
    q.decomposition[1].passage, saved = None, q.decomposition[1].passage
    try:
        with pytest.raises(AnnotationReject, match="no_supporting_paragraph"):
            annotate_question(q)
    finally:
        q.decomposition[1].passage = saved


# ------------------------------------------------------------------ negatives

def test_negatives_are_retrieved_non_gold_chunks(train, annotated):
    from effrag.retrieval import build_retriever

    corpus = Corpus.from_questions([q for qs in train.values() for q in qs])
    retriever = build_retriever("bm25", corpus)
    items = [(q, a.filters) for ds in DATASETS for q, a in annotated[ds][:8]]
    negs = mine_negatives(items, retriever, k=10)
    assert len(negs) == len(items)
    for (q, filters), neg in zip(items, negs):
        queries = negative_queries(q, filters)
        assert queries[0] == (1, q.question) and len(queries) == 1 + len(filters)
        assert {(r["hop"], r["query"]) for r in neg} == set(queries)
        gold_titles = {p.title for p in q.gold}
        for r in neg:
            assert r["tag"] == 0 and set(r["labels"]) == {0} and len(r["labels"]) == len(r["chunk_words"])
            assert r["chunk_id"] not in q.gold_ids and corpus[r["chunk_id"]].title not in gold_titles
        # the negative is the best-ranked non-gold hit of its query
        top = retriever.search([neg[0]["query"]], 10)[0]
        first = next(h for h in top if h.id not in q.gold_ids and h.title not in gold_titles)
        assert neg[0]["chunk_id"] == first.id


@pytest.mark.slow
def test_several_dense_negatives_per_query_are_the_best_non_gold_hits(train, annotated):
    """The recommended recipe's data path: NEG_PER_QUERY=3 negatives per query from the dense retriever."""
    from effrag.retrieval import build_retriever

    items = [(q, a.filters) for ds in DATASETS for q, a in annotated[ds][:4]]
    retriever = build_retriever("dense", Corpus.from_questions([q for q, _ in items]), show_progress=False)
    negs = mine_negatives(items, retriever, k=10, per_query=3)
    for (q, filters), neg in zip(items, negs):
        gold_titles = {p.title for p in q.gold}
        for hop, query in negative_queries(q, filters):
            mine = [r["chunk_id"] for r in neg if r["query"] == query]
            expected = [h.id for h in retriever.search([query], 10)[0]
                        if h.id not in q.gold_ids and h.title not in gold_titles][:3]
            assert mine == expected and len(mine) == 3
    with pytest.raises(ValueError, match="per_query"):
        mine_negatives(items, retriever, k=2, per_query=3)


def test_a_hit_that_states_the_answer_is_not_mined_as_a_negative(train, annotated):
    """--skip-answer-negatives: a passage from elsewhere that holds the question's answer may support it too, so it
    is passed over (whole words, any alias; yes/no answers never match); by default it is taken."""
    from data_synthesis.negatives import states_answer
    from effrag.data.records import Passage
    from effrag.retrieval import build_retriever

    assert states_answer("Laura Knight married Harold Knight in 1903.", [" harold knight "])
    assert not states_answer("Harold Knightley painted.", [" harold knight "])  # whole words only
    q, a = next((q, a) for q, a in annotated["musique"] if normalize_space(q.answer).lower() not in ("yes", "no"))
    planted = Passage(id="planted", title="Elsewhere", text=f"{q.question} The answer: {q.answer}.")
    corpus = Corpus.from_questions([q])
    corpus = Corpus(list(corpus) + [planted])
    retriever = build_retriever("bm25", corpus)
    assert retriever.search([q.question], 1)[0][0].id == "planted"  # the best hit of the question
    skipped = mine_negatives([(q, a.filters)], retriever, k=10, per_query=3, skip_answer=True)[0]
    taken = mine_negatives([(q, a.filters)], retriever, k=10, per_query=3)[0]
    assert "planted" not in {r["chunk_id"] for r in skipped}
    assert "planted" in {r["chunk_id"] for r in taken if r["query"] == q.question}


def test_context_negatives_are_the_questions_own_distractors_hardest_first(train, tmp_path, capsys):
    """--context-negatives N: up to N non-gold context paragraphs per question under the question, most
    question words shared first; none twice with a mined negative; recorded in the run config (resume key)."""
    from data_synthesis.cli import main

    for ds in DATASETS:
        for q in train[ds][:5]:
            gold_titles = {p.title for p in q.gold}
            distractors = [p for p in q.contexts if p.id not in q.gold_ids and p.title not in gold_titles]
            neg = context_negatives(q, 3)
            assert len(neg) == min(3, len(distractors)) > 0
            shared = lambda cid: len(content_keys(words(q.question)) & content_keys(  # noqa: E731
                next(r["chunk_words"] for r in neg if r["chunk_id"] == cid)))
            assert [shared(r["chunk_id"]) for r in neg] == sorted((shared(r["chunk_id"]) for r in neg), reverse=True)
            for r in neg:
                assert r["tag"] == 0 and r["hop"] == 1 and r["query"] == q.question and set(r["labels"]) == {0}
                p = next(p for p in distractors if p.id == r["chunk_id"])
                assert r["chunk_words"] == words(passage_text(p)) and len(r["labels"]) == len(r["chunk_words"])
            # the hardest one left out when already taken; all of them at a large N
            assert neg[0]["chunk_id"] not in {r["chunk_id"] for r in context_negatives(q, 3, exclude={neg[0]["chunk_id"]})}
            assert len(context_negatives(q, 100)) == len(distractors) and context_negatives(q, 0) == []
    inputs = [str(sample_path(ds, "train")) for ds in DATASETS]
    out = tmp_path / "ctx"
    args = ["--inputs", *inputs, "--output", str(out), "--limit", "3", "--no-negatives", "--context-negatives", "2", "--quiet"]
    assert main(args) == 0
    labeler = list(read_jsonl(out / "labeler.jsonl"))
    by_q: dict[str, list] = {}
    for r in labeler:
        by_q.setdefault(r["qid"], []).append(r)
    assert len(by_q) == 9 and all(sum(r["tag"] == 0 for r in rs) == 2 for rs in by_q.values())
    assert json.loads((out / "config.json").read_text())["runs"][0]["context_negatives"] == 2
    capsys.readouterr()
    assert main([*args[:-2], "5", "--quiet"]) == 2  # resuming with another N is refused
    assert "context_negatives" in capsys.readouterr().err
    assert main([*args[:-2], "-1", "--quiet"]) == 2


# ------------------------------------------------------------------ resumable output

def test_writer_drops_partial_lines_and_unfinished_items(tmp_path):
    with ResumableWriter(tmp_path) as w:
        w.write_item("musique", "a", labeler=[{"qid": "a", "dataset": "musique", "x": 1}])
        with pytest.raises(ValueError, match="tagged"):
            w.write_item("musique", "b", labeler=[{"qid": "zz", "dataset": "musique"}])
    with open(tmp_path / "labeler.jsonl", "a") as f:  # item b: records written, no done marker ...
        f.write(json.dumps({"qid": "b", "dataset": "musique", "x": 2}) + "\n")
        f.write('{"qid": "c", "dataset": "musi')  # ... and a torn line from a kill mid-write
    with open(tmp_path / "done.jsonl", "a") as f:
        f.write('{"qid": "b", "data')
    w = ResumableWriter(tmp_path)
    assert w.done_ids == {"musique\ta"}
    assert w.recovered == {"partial_lines": 2, "orphan_records": 1}
    w.write_item("musique", "b", labeler=[{"qid": "b", "dataset": "musique", "x": 3}])
    w.close()
    assert [r["x"] for r in read_jsonl(tmp_path / "labeler.jsonl")] == [1, 3]
    assert [r["qid"] for r in read_jsonl(tmp_path / "done.jsonl")] == ["a", "b"]


def _files(d: Path) -> dict[str, str]:
    return {n: (d / f"{n}.jsonl").read_text() for n in ("labeler", "filter", "rejects", "done")}


def test_resume_after_kill_9_matches_an_uninterrupted_run(tmp_path):
    from helpers import kill_9_when

    inputs = [str(sample_path(ds, "train")) for ds in DATASETS]
    ref = tmp_path / "ref"
    synthesize(inputs, ref, negatives=False, show_progress=False)
    out = tmp_path / "killed"
    env = {**os.environ, "EFFRAG_SYNTH_WRITE_DELAY": "0.15"}
    proc = subprocess.Popen([sys.executable, "-m", "data_synthesis.cli", "--inputs", *inputs, "--output",
                             str(out), "--no-negatives", "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def records_written_but_not_marked_done() -> bool:  # an item's records are written, its done marker is not
        done = {r["qid"] for r in read_jsonl(out / "done.jsonl")} if (out / "done.jsonl").exists() else set()
        lab = out / "labeler.jsonl"
        text = lab.read_text() if lab.exists() else ""
        return len(done) >= 3 and text.endswith("\n") and json.loads(text.splitlines()[-1])["qid"] not in done

    kill_9_when(proc, records_written_but_not_marked_done)
    killed_done = len((out / "done.jsonl").read_text().splitlines())
    assert 3 <= killed_done < 180
    result = synthesize(inputs, out, negatives=False, show_progress=False)
    assert result["skipped_done"] == killed_done and result["recovered"]["orphan_records"] >= 1
    assert _files(out) == _files(ref)


def test_bad_items_become_rejects_and_the_run_goes_on(tmp_path):
    lines = sample_path("musique", "train").read_text().splitlines()[:4]
    broken = json.loads(lines[1])
    broken["question_decomposition"][1]["paragraph_support_idx"] = None
    data = tmp_path / "musique.jsonl"
    data.write_text("\n".join([lines[0], json.dumps(broken), "{not json", lines[2], lines[3]]) + "\n")
    bam = tmp_path / "bamboogle.jsonl"
    bam.write_text("\n".join(sample_path("bamboogle", "dev").read_text().splitlines()[:2]) + "\n")
    out = tmp_path / "out"
    result = synthesize([data, bam], out, negatives=False, show_progress=False)
    assert result["ok"] == 3 and result["rejected"] == 3 and result["malformed"] == 1
    rejects = list(read_jsonl(out / "rejects.jsonl"))
    reasons = {(r["dataset"], r["stage"], r["reason"]) for r in rejects}
    assert ("musique", "load", "malformed_record") in reasons
    assert ("musique", "annotate", "no_supporting_paragraph") in reasons
    assert ("bamboogle", "annotate", "unsupported_dataset") in reasons
    assert any(r["qid"] == broken["id"] for r in rejects)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["musique"]["ok"] == 3 and stats["bamboogle"]["rejected"] == 2
    assert stats["all"]["labeler"] == len(list(read_jsonl(out / "labeler.jsonl")))
    assert stats["all"]["filter"] == len(list(read_jsonl(out / "filter.jsonl")))
    # a rerun does nothing new; other settings are refused
    again = synthesize([data, bam], out, negatives=False, show_progress=False)
    assert again["skipped_done"] == 6 and again.get("ok", 0) == 0
    with pytest.raises(ValueError, match="other settings"):
        synthesize([data], out, negatives=True, show_progress=False)


def test_stats_with_bm25_negatives_and_cli_errors(tmp_path, capsys):
    from data_synthesis.cli import main

    inputs = [str(sample_path(ds, "train")) for ds in DATASETS]
    out = tmp_path / "neg"
    assert main(["--inputs", *inputs, "--output", str(out), "--limit", "5", "--quiet"]) == 0
    stats = compute_stats(out)
    for ds in DATASETS:
        assert stats[ds]["questions"] == 5 and stats[ds]["labeler_neg"] >= 5  # >= 1 per question
        assert 0 < stats[ds]["labeler_label_frac"] < 0.5 and 0 < stats[ds]["tag_continue_frac"] < 1
    labeler = list(read_jsonl(out / "labeler.jsonl"))
    assert stats["all"]["labeler_pos"] == sum(r["tag"] for r in labeler)
    assert "musique" in format_table(stats)
    capsys.readouterr()
    assert main(["--inputs", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["--inputs", *inputs, "--output", str(tmp_path / "x"), "--source", "llm"]) == 2
    assert "--llm" in capsys.readouterr().err


def test_nothing_usable_is_an_error_and_a_bad_line_is_skipped_alike_in_every_mode(tmp_path, capfd):
    """Zero usable questions fail loudly (empty or unrecognised file); a malformed line is skipped the same way
    with or without negatives (the negatives' corpus skips it too), and --quiet shows no progress bars."""
    from data_synthesis.cli import main

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "other.jsonl").write_text('{"foo": 1}\n')
    for name, message in (("empty.jsonl", r"empty.jsonl: empty file \(no records\)"),
                          ("other.jsonl", r"no usable questions in .*other.jsonl \(1 malformed record")):
        with pytest.raises(ValueError, match=message):
            synthesize([tmp_path / name], tmp_path / f"out-{name}", negatives=False, show_progress=False)
        assert not (tmp_path / f"out-{name}").exists()
        assert main(["--inputs", str(tmp_path / name), "--output", str(tmp_path / "o"), "--quiet"]) == 2
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(sample_path("hotpotqa", "train").read_text().splitlines()[:3]
                               + ['{"_id": "x", "question": 5}']) + "\n")
    capfd.readouterr()
    assert main(["--inputs", str(mixed), "--output", str(tmp_path / "neg"), "--quiet"]) == 0
    err = capfd.readouterr().err
    assert "it/s" not in err and "%|" not in err  # --quiet: no tqdm bars, bm25s's included
    plain = synthesize([mixed], tmp_path / "plain", negatives=False, show_progress=False)
    neg = json.loads((tmp_path / "neg" / "stats.json").read_text())["all"]
    assert plain["malformed"] == 1 and plain["ok"] == 3 and neg["ok"] == 3
    assert [r["target"] for r in read_jsonl(tmp_path / "plain" / "filter.jsonl")] == \
        [r["target"] for r in read_jsonl(tmp_path / "neg" / "filter.jsonl")]
