"""Dataset and corpus files whose bytes are not UTF-8 (one error naming file, line, column and offset), line ends,
and 2Wiki v1.1's answer aliases."""
from __future__ import annotations

import json

import pytest
from helpers import raw_records, write_jsonl

from effrag.data import Corpus, DataFormatError, load_questions, sample_path

# ---------------------------------------------------------------- bytes that are not UTF-8

def _bamboogle_lines(n: int) -> list[bytes]:
    return [json.dumps({"Question": f"Question number {i}?", "Answer": f"answer {i}"}).encode() for i in range(n)]


def test_non_utf8_byte_in_jsonl_names_file_line_column_and_offset(tmp_path):
    lines = _bamboogle_lines(20)
    lines[16] = b'{"Qu\xffestion": "x", "Answer": "y"}'  # line 17, column 5
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    offset = sum(len(line) + 1 for line in lines[:16]) + 4
    with pytest.raises(DataFormatError) as e:
        load_questions(path)
    assert str(e.value).startswith(f"{path}:17: not UTF-8 (byte 0xff at column 5, byte offset {offset})")
    assert path.read_bytes()[offset] == 0xFF
    # like invalid JSON, a line with a bad byte is one malformed record that can be skipped
    qs, rep = load_questions(path, skip_malformed=True, report=True)
    assert len(qs) == 19 and rep.skipped == 1 and f"{path}:17: not UTF-8" in rep.errors[0]


def test_non_utf8_byte_in_json_array_names_its_line(tmp_path):
    recs = [{"Question": f"Q {i}?", "Answer": "a"} for i in range(3)]
    text = json.dumps(recs, indent=2).encode()  # one key per line
    bad = text.index(b"Q 2?")  # "Q 2?" is on line 12 of the indented array
    path = tmp_path / "data.json"
    path.write_bytes(text[:bad] + b"\xe9" + text[bad + 1:])  # Latin-1 'é' in place of 'Q'
    line = text[:bad].count(b"\n") + 1
    column = bad - text.rindex(b"\n", 0, bad)
    with pytest.raises(DataFormatError, match=rf"data\.json:{line}: not UTF-8 \(byte 0xe9 at column {column}, "
                                              rf"byte offset {bad}\)"):
        load_questions(path)
    with pytest.raises(DataFormatError, match=rf"data\.json:{line}: not UTF-8"):  # skip_malformed cannot save an array
        load_questions(path, skip_malformed=True)


def test_non_utf8_byte_in_corpus_jsonl_names_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = [json.dumps({"id": str(i), "title": "T", "text": f"text {i}"}).encode() for i in range(5)]
    rows[3] = b'{"id": "3", "title": "Caf\xe9", "text": "x"}'  # Latin-1 file
    path.write_bytes(b"\r\n".join(rows) + b"\r\n")
    offset = sum(len(r) + 2 for r in rows[:3]) + rows[3].index(b"\xe9")
    assert rows[3].index(b"\xe9") + 1 == 26
    with pytest.raises(DataFormatError, match=rf"corpus\.jsonl:4: not UTF-8 \(byte 0xe9 at column 26, "
                                              rf"byte offset {offset}\)"):
        Corpus.from_jsonl(path)


def test_jsonl_lines_end_at_newline_only(tmp_path):
    """U+2028 / U+2029 may stand raw inside JSON strings (json.dumps(ensure_ascii=False) writes them)."""
    path = write_jsonl(tmp_path / "b.jsonl", [{"Question": "line\u2028separator?", "Answer": "a\u2029b"},
                                              {"Question": "second?", "Answer": "c"}])
    qs = load_questions(path)
    assert [q.question for q in qs] == ["line\u2028separator?", "second?"] and qs[0].answers == ["a\u2029b"]


# ---------------------------------------------------------------- 2Wiki v1.1 answer aliases

def test_2wikimqa_keeps_answer_id_only_for_2wiki():
    q = load_questions(sample_path("2wikimqa"))[0]
    assert q.answer_id == raw_records("2wikimqa")[0]["answer_id"] == "Q1150195"
    assert load_questions(sample_path("hotpotqa"))[0].answer_id is None
    assert q.to_json()["answer_id"] == "Q1150195"


def test_alias_file_extends_2wiki_answers_with_aliases_and_demonyms(tmp_path):
    from effrag.data.aliases import apply_answer_aliases, load_answer_aliases

    path = tmp_path / "id_aliases.json"
    path.write_text(
        '{"Q_id": "Q1150195", "aliases": ["Samson and the Mighty Challenge", " "], "demonyms": []}\n'
        '{"Q_id": "Q30", "aliases": ["USA", "United States of America"], "demonyms": ["American", "USA"]}\n'
        '{"Q_id": "Q142", "aliases": ["France"]}\n', "utf-8")
    aliases = load_answer_aliases(path)
    assert aliases == {"Q1150195": ["Samson and the Mighty Challenge"],
                       "Q30": ["USA", "United States of America", "American"], "Q142": ["France"]}
    qs = load_questions(sample_path("2wikimqa"))
    before = [list(q.answers) for q in qs]
    first = qs[0]
    assert apply_answer_aliases(qs, aliases) >= 1
    assert qs[0].answers == ["Samson And His Mighty Challenge", "Samson and the Mighty Challenge"]
    assert first.answers == before[0]  # the Question object itself is not changed: the list holds a copy
    for q, b in zip(qs, before):
        assert q.answers[: len(b)] == b  # the gold answer stays first
        assert q.answers == b or q.answer_id in aliases


def test_alias_file_errors(tmp_path):
    from effrag.data.aliases import apply_answer_aliases, load_answer_aliases

    with pytest.raises(FileNotFoundError, match="alias file not found"):
        load_answer_aliases(tmp_path / "nope.json")
    bad = tmp_path / "a.json"
    bad.write_text('{"Q_id": "Q1", "aliases": []}\n{"id": "Q2", "aliases": []}\n', "utf-8")
    with pytest.raises(DataFormatError, match=r"a\.json:2: field 'Q_id': missing"):
        load_answer_aliases(bad)
    bad.write_text('{"Q_id": "Q1", "aliases": "Paris"}\n', "utf-8")
    with pytest.raises(DataFormatError, match=r"a\.json:1: field 'aliases': expected a list of strings"):
        load_answer_aliases(bad)
    with pytest.raises(ValueError, match="2WikiMultihopQA questions with an 'answer_id'.*hotpotqa"):
        apply_answer_aliases(load_questions(sample_path("hotpotqa")), {"Q1": ["x"]})
