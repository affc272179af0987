"""Your own documents and questions: passage records without ids, folders of text files split into passages,
and ``effrag retrieve`` over the index built from them (with the shipped EfficientRAG, and Direct-R)."""
from __future__ import annotations

import json

import pytest
from helpers import run_cli as run

from effrag.data import Corpus, DataFormatError, passage_id
from effrag.data.documents import corpus_from_inputs, folder_passages, is_passage_file, split_passages

SPACE = """# Space travellers

Sigmund Jähn was a German cosmonaut who flew aboard Soyuz 31 in 1978.
He was the first German in space.

Christer Fuglesang is a Swedish astronaut who first flew on the Space Shuttle Discovery in 2006,
on mission STS-116.
"""
RIVERS = """The Rhine rises in the Swiss Alps and flows into the North Sea.

The Danube flows through ten countries, more than any other river in the world. It ends in the Black Sea.
"""


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    (d / "more").mkdir(parents=True)
    (d / "space.md").write_text(SPACE)
    (d / "more" / "rivers.txt").write_text(RIVERS)
    (d / "image.png").write_bytes(b"\x89PNG")  # not a text file: left out
    return d


# ---------------------------------------------------------------- passages without ids

def test_records_without_id_get_content_hash_ids_and_repeats_count_once(tmp_path):
    f = tmp_path / "mine.jsonl"
    rows = [{"title": "A", "text": "Alpha text."}, {"text": "No title here."}, {"id": 7, "title": "B", "text": "Beta."},
            {"title": "A", "text": "Alpha   text."}]  # the first record again (whitespace aside)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = Corpus.from_jsonl(f)
    assert corpus.ids == [passage_id("A", "Alpha text."), passage_id("", "No title here."), "7"]
    assert corpus[corpus.ids[1]].title == "" and is_passage_file(f)
    f.write_text(json.dumps({"id": "", "text": "x"}) + "\n")
    with pytest.raises(DataFormatError, match=r"mine.jsonl:1: field 'id': expected a non-empty string"):
        Corpus.from_jsonl(f)
    f.write_text(json.dumps({"title": "T"}) + "\n")
    with pytest.raises(DataFormatError, match=r"mine.jsonl:1: field 'text': missing"):
        Corpus.from_jsonl(f)


# ---------------------------------------------------------------- folders of text files

def test_paragraphs_merge_up_to_max_words_and_long_ones_split_at_sentences():
    text = "one two three.\n\nfour five.\n\n\n" + " ".join(f"w{i}." for i in range(7)) + "\n"
    assert split_passages(text, max_words=100) == ["one two three.\n\nfour five.\n\n" + " ".join(f"w{i}." for i in range(7))]
    assert split_passages(text, max_words=5) == ["one two three.\n\nfour five.", "w0. w1. w2. w3. w4.", "w5. w6."]
    # a sentence longer than a passage is cut at the word limit; lines of a paragraph join with one space
    assert split_passages("a b c d e f g\nh", max_words=3) == ["a b c", "d e f", "g h"]
    assert split_passages("  \n\n ", max_words=3) == []
    # a Markdown heading opens a passage, however short the one before
    assert split_passages("intro.\n\n# Part two\n\nbody.", max_words=50) == ["intro.", "# Part two\n\nbody."]
    with pytest.raises(ValueError, match="max_words must be at least 1"):
        split_passages("x", max_words=0)


def test_folder_passages_title_by_file_and_part(docs, tmp_path):
    one = folder_passages(docs)  # each file fits in one passage of 200 words
    assert [p.title for p in one] == ["rivers", "space"]  # sorted by path: more/rivers.txt, space.md
    assert one[1].text.startswith("# Space travellers\n\nSigmund Jähn") and one[1].id == passage_id("space", one[1].text)
    parts = folder_passages(docs, max_words=25)
    assert [p.title for p in parts] == ["rivers (part 1)", "rivers (part 2)", "space (part 1)", "space (part 2)"]
    assert all(len(p.text.split()) <= 25 for p in parts)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no .txt or .md files in it"):
        folder_passages(tmp_path / "empty")
    (docs / "bad.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:1: not UTF-8 \(byte 0xe9"):
        folder_passages(docs)


def test_corpus_build_pools_folders_passage_files_and_dataset_files(docs, tmp_path, capsys):
    from effrag.data import build_corpus, sample_path

    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"title": "Note", "text": "A note of mine."}) + "\n")
    dev = sample_path("hotpotqa", "dev")
    code, out, err = run(["corpus", "build", "--inputs", docs, mine, dev, docs, "--max-words", 25,
                          "--output", tmp_path / "corpus.jsonl"], capsys)
    assert code == 0, err
    corpus = Corpus.from_jsonl(tmp_path / "corpus.jsonl")
    assert corpus.fingerprint() == corpus_from_inputs([docs, mine, dev], max_words=25).fingerprint()
    assert len(corpus) == 4 + 1 + len(build_corpus([dev]))  # the folder given twice counts once
    assert corpus.passages[4].title == "Note"



def test_a_file_name_that_is_not_utf8_is_skipped_with_one_warning_naming_it(docs, tmp_path, capsys, caplog):
    """Issue #69, 2: ``caf\\xe9.txt`` (a Latin-1 name, made through a bytes path) stopped ``effrag corpus build`` and
    ``effrag index build --corpus DIR`` with "surrogates not allowed", naming no file. Its name can give no title: it
    is skipped with one warning naming it (the byte escaped), and the other files are indexed; a folder of only such
    files is one error line."""
    import os
    import subprocess
    import sys

    with open(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), "wb") as f:
        f.write(b"Coffee is brewed from roasted beans.\n")
    assert any("\udce9" in p.name for p in docs.iterdir())  # a real file whose name is not UTF-8
    shown = f"{docs}/caf\\xe9.txt: skipped: its file name is not UTF-8 (a passage's title is its file name); " \
            "rename it to index it"
    with caplog.at_level("WARNING", logger="effrag.data.documents"):
        code, out, err = run(["index", "build", "--corpus", docs, "--retriever", "bm25", "--output", tmp_path / "idx"],
                             capsys)
    assert code == 0, err
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [shown]
    assert sorted(p.title for p in Corpus.from_jsonl(tmp_path / "idx" / "corpus.jsonl").passages) == ["rivers", "space"]
    done = subprocess.run([sys.executable, "-m", "effrag.cli", "corpus", "build", "--inputs", docs, "--output",
                           tmp_path / "corpus.jsonl"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr.strip().splitlines() == [f"WARNING effrag.data.documents: {shown}"]
    assert len(Corpus.from_jsonl(tmp_path / "corpus.jsonl")) == 2
    only = tmp_path / "only"
    only.mkdir()
    os.rename(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), os.path.join(os.fsencode(only), b"caf\xe9.txt"))
    code, _, err = run(["corpus", "build", "--inputs", only, "--output", tmp_path / "none.jsonl"], capsys)
    assert code == 2 and [x for x in err.splitlines() if x.startswith("effrag: error:")] == [
        f"effrag: error: {only}: its 1 text file(s) hold no text (1 skipped: their names are not UTF-8)"]


# ---------------------------------------------------------------- effrag retrieve

@pytest.fixture
def bm25_index(docs, tmp_path, capsys):
    code, _, err = run(["index", "build", "--corpus", docs, "--max-words", 25, "--retriever", "bm25",
                        "--output", tmp_path / "idx"], capsys)
    assert code == 0, err
    return tmp_path / "idx"


def test_retrieve_with_the_shipped_efficientrag_over_a_folder_index(bm25_index, capsys):
    q = "Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?"
    code, out, err = run(["retrieve", "--index", bm25_index, q], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"question: {q}" and lines[1].split() == ["rank", "score", "p_continue", "title:", "text"]
    ranked = [line.split(None, 3) for line in lines[2:] if line.strip()]
    assert [int(r[0]) for r in ranked] == list(range(1, len(ranked) + 1)) and ranked
    assert any("Christer Fuglesang" in r[3] for r in ranked) and "space (part" in out
    shown = [float(r[1]) for r in ranked]
    assert shown == sorted(shown, reverse=True)  # the score column is the one the ranking sorted by
    assert all(0.0 <= float(r[2]) <= 1.0 for r in ranked)  # p(<Continue>), a probability, under its own name
    code, out, err = run(["retrieve", "--index", bm25_index, "--json", q, "Where does the Danube end?"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["question"] for r in rows] == [q, "Where does the Danube end?"]
    assert all({"rank", "id", "score", "p_continue", "title", "text"} <= set(c) for r in rows for c in r["chunks"])
    assert all([c["score"] for c in r["chunks"]] == sorted((c["score"] for c in r["chunks"]), reverse=True)
               for r in rows)
    assert "answer" not in rows[0]


def test_retrieve_direct_r_questions_file_and_one_line_errors(bm25_index, tmp_path, capsys):
    qs = tmp_path / "questions.txt"
    qs.write_text("Where does the Danube end?\n\nWhere does the Rhine rise?\n")
    code, out, err = run(["retrieve", "--index", bm25_index, "--questions", qs, "--method", "direct-r", "--k", 2,
                          "--json"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and all(1 <= len(r["chunks"]) <= 2 for r in rows)  # BM25 returns words that match
    assert all("p_continue" not in c for r in rows for c in r["chunks"])  # one score: the retriever's
    assert rows[0]["chunks"][0]["title"] == "rivers (part 2)" and "Black Sea" in rows[0]["chunks"][0]["text"]
    assert rows[1]["chunks"][0]["title"] == "rivers (part 1)"
    for argv, message in [([], "no question: give one or more questions, or --questions FILE"),
                          (["--questions", tmp_path / "nope.txt"], "questions file not found"),
                          (["--method", "direct-r", "--model", "efficientrag-all", "q?"],
                           "--model and --er-config apply to --method efficientrag, not direct-r")]:
        code, out, err = run(["retrieve", "--index", bm25_index, *argv], capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_retrieve_asks_the_method_for_its_system_by_capability_not_by_name(bm25_index, monkeypatch, capsys):
    """A method that declares ``uses_system`` gets its own system's keywords for --model/--er-config (and no default
    k when its depth is in its config); the default method is the registry's ``DEFAULT_METHOD``."""
    from effrag.pipelines import DEFAULT_METHOD, Pipeline, Result, base, get_pipeline_class

    built = []

    class SystemStub(Pipeline):
        name = "system-stub"
        uses_system = k_in_config = True

        def __init__(self, retriever, **opts):
            built.append(opts)

        @classmethod
        def system_options(cls, model=None, config_file=None):
            return {"weights": f"{model}/weights", "settings": config_file}

        def run(self, question):
            return Result(question=question)

    monkeypatch.setitem(base._REGISTRY, "system-stub", SystemStub)
    code, out, err = run(["retrieve", "--index", bm25_index, "--method", "system-stub", "--model", "sys",
                          "--er-config", "s.json", "--json", "q?"], capsys)
    assert code == 0, err
    assert built == [{"weights": "sys/weights", "settings": "s.json"}]
    assert json.loads(out) == {"question": "q?", "chunks": []}
    code, _, err = run(["retrieve", "--index", bm25_index, "--method", "system-stub", "--k", 3, "q?"], capsys)
    assert code == 0, err
    assert built[-1] == {"weights": "None/weights", "settings": None, "k": 3}
    assert get_pipeline_class(DEFAULT_METHOD).uses_system  # what runs when --method is not given


def test_one_huge_line_without_sentence_ends_splits_in_one_pass():
    """Issue #46, 2: a 16 MB line of words (a list or log file: no blank line, no full stop) took minutes, each cut
    copying the rest of the line. Now every word is kept, in order, in passages of at most max_words."""
    import time

    from effrag.data.documents import split_passages

    line = " ".join(f"w{i % 997}," for i in range(2_000_000))  # ~16 MB
    t0 = time.perf_counter()
    passages = split_passages(line, max_words=200)
    seconds = time.perf_counter() - t0
    assert len(passages) == 10_000 and all(len(p.split()) == 200 for p in passages)
    assert " ".join(passages) == line
    assert seconds < 30, f"{seconds:.1f} s: the split is no longer linear (the quadratic one took minutes)"
