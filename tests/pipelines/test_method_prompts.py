"""The LLM methods' prompts (few-shot examples per dataset, no dev question in any prompt, IRCoT's demos) and the
parsers of their recorded generations (answers, decompositions, Self-Ask events, SearChain's chain of queries, MCR's
vote)."""
from __future__ import annotations

from pathlib import Path

import pytest

from effrag.data import load_questions, sample_files, sample_path
from effrag.evaluation.metrics import normalize_answer
from effrag.pipelines.answers import parse_answer
from effrag.pipelines.decompose_r import parse_decomposition
from effrag.pipelines.ircot import demo_paragraphs
from effrag.pipelines.mcr import majority_answer
from effrag.pipelines.searchain import parse_coq
from effrag.pipelines.self_ask import Chain, _apply, _events
from effrag.prompts import PROMPT_DIR, load_prompt

# ------------------------------------------------------------------ prompts

def _fewshot_questions() -> list[str]:
    out = []
    for path in (PROMPT_DIR / "methods").glob("*.yaml"):
        ps = load_prompt(f"methods/{path.stem}")
        for key, val in ps.data.items():
            if key.endswith("examples") and isinstance(val, dict):
                out += [e["question"] for exs in val.values() for e in exs]
    return out


def test_fewshot_examples_differ_per_dataset_and_fall_back():
    for name in ["direct", "cot", "iter_retgen", "self_ask", "ircot"]:
        ps = load_prompt(f"methods/{name}")
        firsts = {ds: ps.examples(ds)[0]["question"] for ds in ("hotpotqa", "2wikimqa", "musique")}
        assert len(set(firsts.values())) == 3, name
        assert ps.examples("bamboogle") == ps.examples(ps.data["fallback"])
    p = load_prompt("methods/cot")
    text = p.render_examples("2wikimqa", 2)
    assert "Blind Shaft" in text and "Anhalt-Zerbst" in text and "El Extrano" not in text
    assert '{"thought": "Blind Shaft is a 2003' in text  # JSON written by the template, not by hand


def test_no_dev_question_in_any_prompt():
    dev = {normalize_answer(q.question) for f in sample_files("dev") for q in load_questions(f)}
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data beside the checkout, if any
    for f in shared.glob("*/dev.jsonl") if shared.is_dir() else []:
        dev |= {normalize_answer(q.question) for q in load_questions(f)}
    fewshot = _fewshot_questions()
    assert len(fewshot) > 40
    leaked = [q for q in fewshot if normalize_answer(q) in dev]
    assert not leaked, leaked
    # demonstrations drawn from records point at TRAIN records only
    for name, section in [("ircot", "examples"), ("mcr", "decompose_examples"), ("mcr", "meta_examples")]:
        for ds, exs in load_prompt(f"methods/{name}").data[section].items():
            ids = [e["id"] for e in exs if "id" in e]
            train_ids = {q.id for q in load_questions(sample_path(ds, "train"))}
            dev_ids = {q.id for q in load_questions(sample_path(ds, "dev"))}
            assert set(ids) <= train_ids and not set(ids) & dev_ids, (name, ds)


def test_ircot_demo_has_gold_and_m_distractors():
    rec = {q.id: q for q in load_questions(sample_path("musique", "train"))}["2hop__143456_782099"]
    paras = demo_paragraphs("musique", rec.id, 2, seed=0)
    gold = {p.id for p in rec.gold}
    assert gold <= {p.id for p in paras} and len(paras) == len(gold) + 2
    assert [p.id for p in paras] == [p.id for p in demo_paragraphs("musique", rec.id, 2, seed=0)]
    assert [p.id for p in paras] != [p.id for p in demo_paragraphs("musique", rec.id, 2, seed=1)]


# ------------------------------------------------------------------ answer extraction on recorded generations

@pytest.mark.parametrize("text,answer,ok", [
    ("Jane Siberry was born in Toronto. So the answer is: Casa Loma.", "Casa Loma", True),
    ("Follow up: x\nIntermediate answer: y\nSo the final answer is: Rupert III of the Palatinate", "Rupert III of the Palatinate", True),
    ("The director died in 1982. Answer: Elio Petri.", "Elio Petri", True),
    ("The film came out in Washington, D.C.", "The film came out in Washington, D.C.", False),
])
def test_parse_answer_sentence_form(text, answer, ok):
    assert parse_answer(text, "sentence") == (answer, ok)


@pytest.mark.parametrize("text,answer,ok", [
    ('```json\n{"thought": "Pearson Education was created in 1998.", "answer": "1998"}\n```', "1998", True),
    ('<Answer>: ```json\n{"answer": "Miriam Cooper"', "Miriam Cooper", False),
    ('{"thought": "Raoul Walsh married Miriam Cooper. So the answer is Miriam Cooper."}', "Miriam Cooper", False),
    ("I am not sure.", "I am not sure.", False),
])
def test_parse_answer_json_form(text, answer, ok):
    assert parse_answer(text) == (answer, ok)


def test_parse_decomposition():
    assert parse_decomposition('```json\n{"decomposed_questions": ["Who directed X?", "Where was Y born?"]}\n```') \
        == ["Who directed X?", "Where was Y born?"]
    assert parse_decomposition("Who directed X?") is None
    assert parse_decomposition('{"decomposed_questions": []}') is None


def test_self_ask_events_skip_echoed_prompt_lines():
    chain = Chain()
    gen = "Question: Where was the artist of Honeyburst born?\nAre follow up questions needed here: Yes.\n" \
          "Follow up: Who is the artist of Honeyburst?"
    assert _apply(chain, _events(gen, "needed"))
    assert chain.needed == "Yes." and [s.question for s in chain.steps] == ["Who is the artist of Honeyburst?"]
    assert _apply(chain, _events("Tim Christensen.\nFollow up: Where was Tim Christensen born?", "ia"))
    assert chain.steps[0].answer == "Tim Christensen." and chain.pending.question == "Where was Tim Christensen born?"
    assert not _apply(chain, _events("Follow up: Where was Tim Christensen born?", "text"))  # no new step


def test_parse_coq_reads_nodes_and_unsolved_queries():
    gen = """[Question]: "Where do greyhound buses that are in the birthplace of Spirit If...s performer leave from?"
[Query 1]: Who is the performer of Spirit If... ?
If you know the answer:
[Answer 1]: Kevin Drew.
[Query 2]: Where was Kevin Drew born?
If you don't know the answer:
[Unsolved Query]: Where was Kevin Drew born?
[Query 3]: Where do greyhound buses in Toronto leave from?
[Final Content]: The performer is Kevin Drew [1]. So the final answer is Toronto Coach Terminal."""
    coq = parse_coq(gen)
    assert [(n.query, n.answer, n.unsolved) for n in coq.nodes] == [
        ("Who is the performer of Spirit If... ?", "Kevin Drew.", False),
        ("Where was Kevin Drew born?", None, True),
        ("Where do greyhound buses in Toronto leave from?", None, True)]
    assert coq.final_content.endswith("Toronto Coach Terminal.")


def test_majority_vote_ignores_unknown_and_breaks_ties_by_chain_order():
    assert majority_answer(["Paris", "unknown", "London", "paris", None])[0] == "Paris"
    assert majority_answer(["London", "Paris"])[0] == "London"
    assert majority_answer([None, "Unknown"])[0] is None
