"""Loaders, corpus and gold mapping on the bundled real sample, and on broken input (bytes that are not UTF-8 and
2Wiki's answer aliases: test_data_encoding.py)."""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
from helpers import raw_records, write_jsonl

from effrag.data import (
    Corpus,
    CorpusError,
    DataFormatError,
    Passage,
    build_corpus,
    detect_format,
    load_questions,
    map_gold,
    passage_id,
    sample_files,
    sample_path,
)

# ---------------------------------------------------------------- loaders on real records

def test_hotpotqa_known_record():
    qs = load_questions(sample_path("hotpotqa"))
    assert len(qs) == 30
    q = qs[0]
    assert q.id == "5a7145d55542994082a3e73c" and q.dataset == "hotpotqa"
    assert q.question == "Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?"
    assert q.answers == ["Christer Fuglesang"] and q.type == "comparison"
    assert [p.title for p in q.gold] == ["Sigmund Jähn", "Christer Fuglesang"]
    assert q.supporting_sentences == [[0], [0, 1]]
    assert len(q.contexts) == 10 and all(g in q.contexts for g in q.gold)
    rec = raw_records("hotpotqa")[0]
    sents = dict((t, s) for t, s in rec["context"])["Christer Fuglesang"]
    gold = q.gold[1]
    assert gold.text == "".join(sents).strip()  # HotpotQA sentences carry their own leading space
    assert gold.sentences == [s.strip() for s in sents] and "  " not in gold.text
    assert gold.id == passage_id("Christer Fuglesang", gold.text)


def test_2wikimqa_known_records():
    q = load_questions(sample_path("2wikimqa"))[0]
    assert q.id == "02ae4663095611ebbdaeac1f6bf848b6" and q.dataset == "2wikimqa"
    assert q.answers == ["Samson And His Mighty Challenge"]
    assert [p.title for p in q.gold] == ["Enemmy", "Samson and His Mighty Challenge"]
    assert q.evidences[:2] == [("Enemmy", "publication date", "2013"),
                               ("Samson and His Mighty Challenge", "publication date", "1964")]
    assert q.decomposition == []
    sents = dict((t, s) for t, s in raw_records("2wikimqa")[0]["context"])["Enemmy"]
    assert q.gold[0].text == " ".join(sents)  # 2Wiki sentences have no leading space
    # a bridge-comparison question with four gold passages, in supporting-fact order
    q4 = load_questions(sample_path("2wikimqa", "train"))[1]
    assert [p.title for p in q4.gold] == ["With Time to Kill", "The Undercover Woman",
                                          "James Clayden", "Thomas Carr (director)"]


def test_musique_known_record_with_aliases_and_decomposition():
    q = load_questions(sample_path("musique"))[0]
    assert q.id == "2hop__124412_402641" and q.type == "2hop"
    assert q.answers == ["Chiang Hsiao-wu", "Alex Chiang"]
    assert [p.title for p in q.gold] == ["Chiang Hsiao-wen", "Chiang Hsiao-wu"]
    assert q.supporting_sentences is None and len(q.contexts) == 20
    d = q.decomposition
    assert [(s.question, s.answer, s.passage, s.dependencies) for s in d] == [
        ("The father of Chiang Hsiao-wen is whom?", "Chiang Ching-kuo", 0, []),
        ("#1 >> child", "Chiang Hsiao-wu", 1, [0]),
    ]


def test_musique_four_hop_dependencies_and_gold_order(tmp_path):
    """Decomposition text of the real dev record 4hop3__373866_5189_31809_86687, short paragraphs."""
    rec = {
        "id": "4hop3__373866_5189_31809_86687", "question": "When did ...?", "answer": "May 1990",
        "answer_aliases": ["1990", "May 1990"], "answerable": True,
        "paragraphs": [{"idx": i, "title": f"T{i}", "paragraph_text": f"text {i}", "is_supporting": i in (0, 2, 9, 10)}
                       for i in range(12)],
        "question_decomposition": [
            {"id": 373866, "question": "People's Socialist Republic of Albania >> member of",
             "answer": "Warsaw Pact", "paragraph_support_idx": 10},
            {"id": 5189, "question": "Which nation was in effective control of both political and military functions of #1 ?",
             "answer": "the USSR", "paragraph_support_idx": 2},
            {"id": 31809, "question": "What organization killed Gaddafi's grandsons?",
             "answer": "NATO", "paragraph_support_idx": 9},
            {"id": 86687, "question": "when did the #2 agree to a unified germany inside of #3",
             "answer": "May 1990", "paragraph_support_idx": 0},
        ],
    }
    (q,) = load_questions(write_jsonl(tmp_path / "m.jsonl", [rec]))
    assert q.answers == ["May 1990", "1990"]  # answer first, duplicates dropped
    assert [p.title for p in q.gold] == ["T10", "T2", "T9", "T0"]  # hop order, not idx order
    assert [s.dependencies for s in q.decomposition] == [[], [0], [], [1, 2]]
    assert q.decomposition[3].question == "when did the #2 agree to a unified germany inside of #3"
    assert [s.passage for s in q.decomposition] == [0, 1, 2, 3] and q.type == "4hop3"


def test_gold_in_hop_order_for_every_sample_record():
    for ds in ("hotpotqa", "2wikimqa"):
        changed = 0
        for split in ("train", "dev"):
            for q, rec in zip(load_questions(sample_path(ds, split)), raw_records(ds, split)):
                first_seen = list(dict.fromkeys(t for t, _ in rec["supporting_facts"]))
                assert [p.title for p in q.gold] == first_seen
                context_order = [t for t, _ in rec["context"] if t in first_seen]
                changed += context_order != first_seen
        assert changed > 0, f"{ds}: no record where hop order differs from context order"
    for split in ("train", "dev"):
        for q, rec in zip(load_questions(sample_path("musique", split)), raw_records("musique", split)):
            paras = {p["idx"]: p for p in rec["paragraphs"]}
            want = [paras[s["paragraph_support_idx"]]["title"] for s in rec["question_decomposition"]]
            assert [p.title for p in q.gold] == want
            assert {p.id for p in q.gold} == {passage_id(p["title"], p["paragraph_text"])
                                              for p in rec["paragraphs"] if p["is_supporting"]}


def test_bamboogle_and_strategyqa():
    b = load_questions(sample_path("bamboogle"))
    assert len(b) == 10 and b[0].answers == ["james madison"] and b[0].contexts == []
    assert b[0].question == "Who was president of the United States in the year that Citibank was founded?"
    assert len({q.id for q in b}) == 10
    s = load_questions(sample_path("strategyqa"))
    assert s[0].id == "e0044a7b4d146d611e73" and s[0].answers == ["no"]
    assert [r["answer"] for r in raw_records("strategyqa")].count(True) == sum(q.answers == ["yes"] for q in s)
    assert s[0].decomposition[4].question == "Is #3 smaller than #4?"
    assert [d.dependencies for d in s[0].decomposition] == [[], [], [0], [1], [2, 3]]


def test_detect_format_and_override(tmp_path):
    assert [detect_format(raw_records(ds)[0]) for ds in ("hotpotqa", "2wikimqa", "musique", "bamboogle", "strategyqa")] == [
        "hotpotqa", "2wikimqa", "musique", "bamboogle", "strategyqa"]
    with pytest.raises(DataFormatError, match="unknown record format"):
        detect_format({"foo": 1})
    # a 2Wiki record read as HotpotQA joins sentences without spaces and drops evidences
    q = load_questions(sample_path("2wikimqa"), dataset="hotpotqa", limit=1)[0]
    assert q.dataset == "hotpotqa" and q.evidences == [] and q.gold[0].text.count(". ") == 0
    with pytest.raises(ValueError, match="unknown dataset"):
        load_questions(sample_path("2wikimqa"), dataset="nq")
    p = write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(DataFormatError, match=r"x\.jsonl:1: unknown record format"):
        load_questions(p)


def test_limit():
    assert [q.id for q in load_questions(sample_path("hotpotqa"), limit=3)] == [
        q.id for q in load_questions(sample_path("hotpotqa"))[:3]]


def test_json_array_equals_jsonl(tmp_path):
    for ds in ("hotpotqa", "2wikimqa", "musique", "bamboogle", "strategyqa"):
        arr = tmp_path / f"{ds}.json"
        arr.write_text(json.dumps(raw_records(ds), indent=1), "utf-8")
        assert [q.to_json() for q in load_questions(arr)] == [q.to_json() for q in load_questions(sample_path(ds))]


# ---------------------------------------------------------------- malformed input

def test_missing_field_names_file_line_field(tmp_path):
    recs = raw_records("hotpotqa")[:5]
    del recs[2]["answer"]
    p = write_jsonl(tmp_path / "hotpotqa" / "dev.jsonl", recs)
    with pytest.raises(DataFormatError) as e:
        load_questions(p)
    assert str(e.value) == f"{p}:3: field 'answer': missing"


def test_bad_supporting_fact_title(tmp_path):
    recs = raw_records("hotpotqa")[:3]
    recs[1]["supporting_facts"][0][0] = "No Such Title"
    p = write_jsonl(tmp_path / "dev.jsonl", recs)
    with pytest.raises(DataFormatError, match=r"dev\.jsonl:2: field 'supporting_facts': title 'No Such Title' not in context"):
        load_questions(p)


def test_bad_nested_fields(tmp_path):
    m = raw_records("musique")[:2]
    m[1]["question_decomposition"][1]["paragraph_support_idx"] = 99
    with pytest.raises(DataFormatError, match=r"m\.jsonl:2: field 'question_decomposition\[1\]\.paragraph_support_idx': no paragraph with idx 99"):
        load_questions(write_jsonl(tmp_path / "m.jsonl", m))
    w = raw_records("2wikimqa")[:1]
    w[0]["context"][3] = ["title only"]
    with pytest.raises(DataFormatError, match=r"w\.jsonl:1: field 'context\[3\]': expected \[title"):
        load_questions(write_jsonl(tmp_path / "w.jsonl", w))
    s = raw_records("strategyqa")[:1]
    s[0]["answer"] = "yes"
    with pytest.raises(DataFormatError, match=r"s\.jsonl:1: field 'answer': expected bool, got str"):
        load_questions(write_jsonl(tmp_path / "s.jsonl", s))


def test_bad_json_line_and_array_index(tmp_path):
    lines = sample_path("bamboogle").read_text("utf-8").splitlines()
    lines[3] = lines[3][:-5]
    p = tmp_path / "b.jsonl"
    p.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(DataFormatError, match=r"b\.jsonl:4: invalid JSON"):
        load_questions(p)
    recs = raw_records("hotpotqa")[:4]
    del recs[3]["context"]
    arr = tmp_path / "h.json"
    arr.write_text(json.dumps(recs), "utf-8")
    with pytest.raises(DataFormatError, match=r"h\.json\[3\]: field 'context': missing"):
        load_questions(arr)


def test_duplicate_question_id(tmp_path):
    recs = raw_records("musique")[:3]
    recs.append(recs[1])
    with pytest.raises(DataFormatError, match=r"d\.jsonl:4: field 'id': duplicate question id '.*' \(first at .*d\.jsonl:2\)"):
        load_questions(write_jsonl(tmp_path / "d.jsonl", recs))


def test_skip_malformed_counts_and_warns(tmp_path, caplog):
    recs = raw_records("2wikimqa")
    del recs[4]["supporting_facts"]
    recs[9]["supporting_facts"][0][0] = "Nowhere"
    p = write_jsonl(tmp_path / "w.jsonl", recs)
    with pytest.raises(DataFormatError):
        load_questions(p)
    with caplog.at_level(logging.WARNING, logger="effrag.data.loaders"):
        qs, rep = load_questions(p, skip_malformed=True, report=True)
    assert len(qs) == rep.loaded == 28 and rep.skipped == 2
    assert rep.errors[0].startswith(f"{p}:5: field 'supporting_facts'") and ":10:" in rep.errors[1]
    assert any("skipped 2 malformed record(s)" in r.getMessage() for r in caplog.records)
    assert recs[4]["_id"] not in {q.id for q in qs}


# ---------------------------------------------------------------- corpus and gold mapping

def test_corpus_dedups_paragraphs_across_questions_and_files(sample_corpus, sample_train_questions,
                                                              sample_dev_questions):
    qs = sample_train_questions + sample_dev_questions
    uses = Counter(p.id for q in qs for p in q.contexts)
    assert len(sample_corpus) == len(uses) < sum(uses.values())
    assert len(set(sample_corpus.ids)) == len(sample_corpus)
    shared = next(pid for pid, n in uses.items() if n > 1)
    assert sample_corpus.ids.count(shared) == 1
    # pooled across the train and dev files of one dataset
    files = [sample_path("2wikimqa", "train"), sample_path("2wikimqa", "dev")]
    train_ids = {p.id for q in load_questions(files[0]) for p in q.contexts}
    dev_ids = {p.id for q in load_questions(files[1]) for p in q.contexts}
    pooled = build_corpus(files)
    assert set(pooled.ids) == train_ids | dev_ids and len(pooled) == len(train_ids | dev_ids)
    assert train_ids & dev_ids, "expected a 2Wiki paragraph shared by train and dev"


def test_map_gold_every_sample_question(sample_corpus, sample_train_questions, sample_dev_questions):
    qs = sample_train_questions + sample_dev_questions
    mapped = map_gold(qs, sample_corpus)
    assert len(mapped) == len(qs)
    for q, ids in zip(qs, mapped):
        assert len(ids) == len(q.gold) == len(set(ids))
        assert [sample_corpus[i].title for i in ids] == [p.title for p in q.gold]
    assert sum(map(len, mapped)) > 2 * 270


def test_corpus_access_save_and_fingerprint(tmp_path, sample_corpus):
    p = sample_corpus.passages[5]
    assert p.id in sample_corpus and sample_corpus[p.id] is p and sample_corpus.position(p.id) == 5
    assert "nope" not in sample_corpus
    with pytest.raises(KeyError, match="not in corpus"):
        sample_corpus["nope"]
    assert [x.id for x in sample_corpus] == sample_corpus.ids
    path = sample_corpus.save(tmp_path / "c.jsonl")
    assert json.loads(path.read_text("utf-8").splitlines()[5]) == p.to_json()
    again = Corpus.from_jsonl(path)
    assert again.ids == sample_corpus.ids and again.fingerprint() == sample_corpus.fingerprint()
    reordered = Corpus(reversed(sample_corpus.passages))
    assert reordered.fingerprint() != sample_corpus.fingerprint()
    assert len(sample_corpus.fingerprint()) == 16


def test_user_corpus_with_own_ids_maps_gold_by_content(tmp_path):
    qs = load_questions(sample_path("musique"))
    rows = [{"id": f"doc-{i}", "title": p.title, "text": "  " + p.text.replace(" ", "\n", 1)}
            for i, p in enumerate(Corpus.from_questions(qs))]
    corpus = Corpus.from_jsonl(write_jsonl(tmp_path / "user.jsonl", rows))
    mapped = map_gold(qs, corpus)
    assert all(i.startswith("doc-") for ids in mapped for i in ids)
    assert [corpus[i].title for i in mapped[0]] == ["Chiang Hsiao-wen", "Chiang Hsiao-wu"]
    # drop the first question's gold passages: a clear error, or a report on request
    gone = set(mapped[0])
    small = Corpus.from_jsonl(write_jsonl(tmp_path / "small.jsonl", [r for r in rows if r["id"] not in gone]))
    with pytest.raises(CorpusError, match=r"2 of \d+ gold passages \(1 questions\) not found.*2hop__124412_402641"):
        map_gold(qs, small)
    ids, rep = map_gold(qs, small, report=True)
    assert ids[0] == [] and ids[1:] == mapped[1:]
    assert rep.missing == [("2hop__124412_402641", "Chiang Hsiao-wen"), ("2hop__124412_402641", "Chiang Hsiao-wu")]


def test_user_corpus_errors(tmp_path):
    good = {"id": "a", "title": "T", "text": "some text"}
    with pytest.raises(DataFormatError, match=r"c\.jsonl:3: field 'id': duplicate id 'a' \(first on line 1\)"):
        Corpus.from_jsonl(write_jsonl(tmp_path / "c.jsonl", [good, {**good, "id": "b"}, good]))
    with pytest.raises(DataFormatError, match=r"c2\.jsonl:2: field 'text': missing"):
        Corpus.from_jsonl(write_jsonl(tmp_path / "c2.jsonl", [good, {"id": "b", "title": "T"}]))
    no_id = Corpus.from_jsonl(write_jsonl(tmp_path / "c3.jsonl", [{"title": "T", "text": "x"}]))  # content hash
    assert no_id.ids == [passage_id("T", "x")]
    with pytest.raises(DataFormatError, match=r"c3\.jsonl:1: field 'id': expected a non-empty string or integer"):
        Corpus.from_jsonl(write_jsonl(tmp_path / "c3.jsonl", [{"id": None, "title": "T", "text": "x"}]))
    int_ids = Corpus.from_jsonl(write_jsonl(tmp_path / "c4.jsonl", [{"id": 7, "text": "x"}]))
    assert int_ids.ids == ["7"] and int_ids["7"].title == ""
    (tmp_path / "empty.jsonl").write_text("\n", "utf-8")
    with pytest.raises(CorpusError, match="empty"):
        Corpus.from_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(CorpusError, match="empty"):
        Corpus([])
    with pytest.raises(CorpusError, match="no context passages"):
        Corpus.from_questions(load_questions(sample_path("bamboogle")))
    with pytest.raises(CorpusError, match="duplicate passage id"):
        Corpus([Passage.make("T", "x"), Passage.make("T", " x ")])


# ---------------------------------------------------------------- bundled sample

def test_sample_paths():
    assert [f.parent.name for f in sample_files("dev")] == ["hotpotqa", "2wikimqa", "musique", "bamboogle", "strategyqa"]
    assert [f.parent.name for f in sample_files("train")] == ["hotpotqa", "2wikimqa", "musique"]
    with pytest.raises(FileNotFoundError, match="available: .*hotpotqa/dev"):
        sample_path("bamboogle", "train")
    assert (sample_path("hotpotqa").parent.parent / "README.md").read_text("utf-8").count("License") >= 5


@pytest.mark.parametrize("ds,split,n", [("hotpotqa", "train", 60), ("musique", "dev", 30), ("strategyqa", "dev", 10)])
def test_sample_is_verbatim_prefix_of_shared_data(ds, split, n):
    src = Path(__file__).resolve().parents[3] / "shared" / "data" / ds / f"{split}.jsonl"
    if not src.is_file():
        pytest.skip(f"{src} not present")
    lines = sample_path(ds, split).read_bytes().splitlines(keepends=True)
    assert len(lines) == n
    with src.open("rb") as f:
        assert lines == [f.readline() for _ in range(n)]


def test_an_empty_dataset_file_says_so(tmp_path):
    from effrag.data.loaders import DataFormatError

    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataFormatError, match=r"empty.jsonl: empty file \(no records\)"):
        load_questions(tmp_path / "empty.jsonl")
    with pytest.raises(DataFormatError, match="empty file"):
        load_questions(tmp_path / "empty.jsonl", skip_malformed=True)
