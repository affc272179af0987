"""One result type for every method: what pipelines return, what predictions.jsonl rows are made of,
what the adapters and the API hand out; the prompt filler and loader behind the LLM methods.

Everything runs for real on the bundled HotpotQA sample (BM25, tiny randomly initialised Labeler/Filter
and IRRR encoders); LLM generations are replayed so the rows are exact.
"""
from __future__ import annotations

import inspect
import json

import pytest

from effrag.data import Corpus, Question, load_questions, sample_path
from effrag.evaluation import evaluate
from effrag.llm import Completion
from effrag.pipelines import (
    Chunk,
    Pipeline,
    Result,
    available_pipelines,
    build_pipeline,
    get_pipeline_class,
    llm_options,
    reader_options,
)
from effrag.pipelines.generation import Generator
from effrag.prompts import PromptSet, fill, load_prompt
from effrag.retrieval import BM25Retriever

ROW_START = ["qid", "dataset", "question", "gold", "answers", "latency_s"]


class Replay:
    """An LLM that plays back fixed generations (the last one forever)."""

    n_ctx = 4096

    def __init__(self, *outputs: str):
        self.outputs = list(outputs)

    def chat(self, messages, **kw):
        text = self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]
        return [Completion(text, prompt_tokens=len(messages[-1]["content"]) // 4, completion_tokens=3)]

    def chat_many(self, batch, **kw):
        return [self.chat(m, **kw) for m in batch]


class FixedReader:
    """SearChain's reader interface: the first two words of the document, confidence 0."""

    def predict(self, questions, docs):
        return [type("Read", (), {"text": " ".join(d.split()[:2]), "confidence": 0.0})() for d in docs]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def hotpot():
    return load_questions(sample_path("hotpotqa", "dev"))[:20]


@pytest.fixture(scope="module")
def bm25(hotpot):
    return BM25Retriever(Corpus.from_questions(hotpot), show_progress=False)


# ---------------------------------------------------------------------- the type and its row

def test_result_to_row_is_the_predictions_row_format():
    chunks = [Chunk("a", "A", "text a", 0.9, hop=0, kept_words=["text"]), Chunk("b", "B", "text b", 0.4, hop=1)]
    er = Result("q?", chunks, trace={"hops": [{"hop": 0}]}, iterations=2,
                timing={"retrieval": 0.1234567891, "labeler": 0.5, "filter": 0.0, "other": 0.0, "total": 0.62})
    row = er.to_row()
    assert list(row) == ["retrieved", "scores", "llm_calls", "prompt_tokens", "completion_tokens", "iterations",
                         "trace", "timing"]
    assert row == {"retrieved": ["a", "b"], "scores": [0.9, 0.4], "llm_calls": 0, "prompt_tokens": 0,
                   "completion_tokens": 0, "iterations": 2, "trace": {"hops": [{"hop": 0}]},
                   "timing": {"retrieval": 0.123457, "labeler": 0.5, "filter": 0.0, "other": 0.0, "total": 0.62}}
    llm = Result("q?", chunks[:1], "Paris", trace={"llm_log": []}, llm_calls=2, prompt_tokens=30,
                 completion_tokens=4, extra={"parse_failures": 1, "method_latency_s": 0.25})
    assert list(llm.to_row()) == ["retrieved", "scores", "llm_calls", "prompt_tokens", "completion_tokens",
                                  "iterations", "answer", "trace", "parse_failures", "method_latency_s"]
    assert json.loads(json.dumps(llm.to_row()))["answer"] == "Paris"
    # the result reads as its chunk list (the public API's promise) and has an HTTP form
    assert [c.id for c in er] == er.ids == ["a", "b"] and len(er) == 2 and er[1].hop == 1
    body = er.to_json(include_trace=False)
    assert body["chunks"][0]["kept_text"] == "text" and "trace" not in body and body["info"]["iterations"] == 2
    assert Result("q?").to_row() == {"retrieved": [], "scores": [], "llm_calls": 0, "prompt_tokens": 0,
                                     "completion_tokens": 0, "iterations": 1}


def test_chunk_from_hits_dicts_and_chunks(bm25, hotpot):
    hit = bm25.search([hotpot[0].question], 1)[0][0]
    c = Chunk.from_hit(hit, hop=2, query="q")
    assert (c.id, c.title, c.text, c.score, c.retrieval_score, c.hop, c.query) == \
        (hit.id, hit.title, hit.text, hit.score, hit.score, 2, "q")
    assert Chunk.from_hit(hit, score=0.5).score == 0.5 and Chunk.from_hit(c) is c
    assert Chunk.from_hit({"id": 7, "text": "t", "kept_words": ["t"]}).kept_text == "t"
    with pytest.raises(TypeError, match="need 'id' and a string 'text'"):
        Chunk.from_hit({"title": "no id"})


def test_eval_rows_of_efficientrag_and_an_llm_method(tmp_path, bm25, hotpot, tiny_efficientrag_dirs):
    qs = [Question(id=q.id, dataset="hotpotqa", question=q.question, answers=q.answers) for q in hotpot[:2]]
    er = build_pipeline("efficientrag", bm25, labeler=str(tiny_efficientrag_dirs["labeler"]),
                        filter=str(tiny_efficientrag_dirs["filter"]), hop_k=2, max_hops=2, tag_threshold=0.0)
    evaluate(er, qs, [[], []], tmp_path / "er", {"method": "efficientrag"}, batch_size=2, show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "er" / "predictions.jsonl").read_text().splitlines()]
    expected = [r.to_row() for r in er.run_batch([q.question for q in qs])]
    for row, exp in zip(rows, expected):
        assert list(row) == ROW_START + ["retrieved", "scores", "llm_calls", "prompt_tokens", "completion_tokens",
                                         "iterations", "trace", "timing"]
        assert {k: row[k] for k in ("retrieved", "scores", "iterations", "llm_calls")} == \
            {k: exp[k] for k in ("retrieved", "scores", "iterations", "llm_calls")}
        assert [h["hop"] for h in row["trace"]["hops"]] == [0, 1] and len(row["retrieved"]) == 4

    direct = build_pipeline("direct", None, llm=Replay('```json\n{"answer": "Paris"}\n```'), dataset="hotpotqa")
    evaluate(direct, qs, [[], []], tmp_path / "direct", {"method": "direct"}, show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "direct" / "predictions.jsonl").read_text().splitlines()]
    for row in rows:
        assert list(row) == ROW_START + ["retrieved", "scores", "llm_calls", "prompt_tokens", "completion_tokens",
                                         "iterations", "answer", "trace", "parse_failures", "method_latency_s"]
        assert (row["answer"], row["llm_calls"], row["parse_failures"], row["retrieved"]) == ("Paris", 1, 0, [])
        assert row["trace"]["generation"].endswith("```") and len(row["trace"]["llm_log"]) == 1


# ---------------------------------------------------------------------- every registered method

def _build(name, bm25, tmp_path, tiny_efficientrag_dirs):
    if name == "direct-r":
        return build_pipeline(name, bm25, k=3)
    if name == "efficientrag":
        return build_pipeline(name, bm25, labeler=str(tiny_efficientrag_dirs["labeler"]),
                              filter=str(tiny_efficientrag_dirs["filter"]), hop_k=2, max_hops=2, tag_threshold=0.0)
    if name == "irrr":
        from helpers import make_base

        from effrag.models import IRRRModel

        model = IRRRModel.from_encoder(make_base("electra", tmp_path / "electra"), {"max_length": 128})
        return build_pipeline(name, bm25, irrr_model=model, k=2, irrr_max_path=2)
    llm = Replay(" Yes.\nFollow up: Who directed the film?", "So the answer is: Ed Wood.")
    opts = {"searchain": {"reader": FixedReader(), "max_rounds": 1}, "ircot": {"max_steps": 1, "demos": 0},
            "mcr": {"chains": 1, "max_follow_ups": 1}, "self-ask": {"max_follow_ups": 1},
            "iter-retgen": {"iterations": 2}}.get(name, {})
    return build_pipeline(name, bm25, k=2, llm=llm, dataset="hotpotqa", **opts)


@pytest.mark.parametrize("name", available_pipelines())
def test_every_registered_pipeline_returns_results(name, bm25, hotpot, tmp_path, tiny_efficientrag_dirs):
    pipe = _build(name, bm25, tmp_path, tiny_efficientrag_dirs)
    questions = [q.question for q in hotpot[:2]]
    results = pipe.run_batch(questions)
    assert len(results) == 2 and all(isinstance(r, Result) for r in results)
    assert [r.question for r in results] == questions and isinstance(pipe.run(questions[0]), Result)
    for r in results:
        row = json.loads(json.dumps(r.to_row()))  # a predictions.jsonl row
        assert row["retrieved"] == r.ids and len(set(r.ids)) == len(r.ids) and len(row["scores"]) == len(r)
        for c in r:
            assert isinstance(c, Chunk) and c.text and isinstance(c.hop, int) and c.hop >= 0
        assert (r.answer is not None) == (pipe.uses_llm or name == "irrr")


@pytest.mark.parametrize("name", available_pipelines())
def test_declared_needs_match_the_constructor(name):
    """``uses_llm`` / ``uses_generator`` / ``uses_dataset`` say what ``__init__`` takes (the CLI trusts them)."""
    cls = get_pipeline_class(name)
    takes = set(inspect.signature(cls.__init__).parameters)
    for mro_cls in cls.__mro__:  # keywords passed on to a base class through **kw
        if "__init__" in vars(mro_cls):
            takes |= set(inspect.signature(mro_cls.__init__).parameters)
    assert cls.uses_llm == ("llm" in takes) and cls.uses_generator == ("generator" in takes)
    assert cls.uses_dataset == ("dataset" in takes) and cls.uses_reader == ("reader" in takes)


def test_llm_options_follow_the_declarations():
    assert llm_options(get_pipeline_class("direct-r"), None, "hotpotqa") == {}
    gen = llm_options(get_pipeline_class("efficientrag"), "default", "musique")["generator"]
    assert isinstance(gen, Generator) and gen.dataset == "musique" and gen.llm == "default"
    assert llm_options(get_pipeline_class("ircot"), "gguf:x", "hotpotqa") == {"llm": "gguf:x", "dataset": "hotpotqa"}
    assert llm_options(get_pipeline_class("cot"), None, "2wikimqa") == {"dataset": "2wikimqa"}
    assert isinstance(llm_options(get_pipeline_class("irrr"), "default", "hotpotqa")["generator"], Generator)

    class RetrievalOnly(Pipeline):  # takes neither an LLM nor a generator
        name = "retrieval-only"

    with pytest.raises(ValueError, match="method 'retrieval-only' does not use an LLM"):
        llm_options(RetrievalOnly, "default", "hotpotqa")


def test_reader_options_follow_the_declarations():
    assert reader_options(get_pipeline_class("direct-r"), None) == {}
    assert reader_options(get_pipeline_class("searchain"), "ckpt") == {"reader": "ckpt"}
    with pytest.raises(ValueError, match="method 'ircot' answers with its LLM; --reader applies to .*direct-r"):
        reader_options(get_pipeline_class("ircot"), "ckpt")
    with pytest.raises(FileNotFoundError, match="reader checkpoint nowhere: no heads.safetensors"):
        reader_options(get_pipeline_class("efficientrag"), "nowhere")


def test_llm_methods_give_each_chunk_its_hop_and_query(bm25, hotpot):
    q, sentence = hotpot[0].question, hotpot[3].question  # a reason-step sentence that finds other passages
    ircot = build_pipeline("ircot", bm25, k=2, llm=Replay(sentence, "So the answer is: Ed Wood.", "Ed Wood"),
                           dataset="hotpotqa", demos=0, max_steps=2)
    r = ircot.run(q)
    first = [h.id for h in bm25.search([q], 2)[0]]
    assert r.ids[:2] == first and all(c.hop == 0 and c.query == q for c in r.chunks[:2])
    later = r.chunks[2:]
    assert later and all(c.hop == 1 and c.query == sentence for c in later)
    assert r.ids[2:] == [h.id for h in bm25.search([sentence], 2)[0] if h.id not in first]
    assert [c.score for c in r] == [c.retrieval_score for c in r]  # LLM methods rank by the retriever's score


# ---------------------------------------------------------------------- prompts: one loader, one filler

def test_fill_strict_and_verbatim_templates():
    assert fill('{{"answer": {answer_json}}} {q}', q="a {b}", answer='say "x"') == '{"answer": "say \\"x\\""} a {b}'
    with pytest.raises(KeyError, match="t.yaml:query: template needs field 'question'"):
        fill("Q: {question}", "t.yaml:query", answer="x")
    with pytest.raises(ValueError, match="single '}'"):
        fill("a } b")
    # a paper's prompt: only the given fields are filled, every other brace text stays as written
    text = '{KNOWLEDGE FOR YOUR REFERENCE}\n{"answer": "x"} {{kept}} {other}\n{question}'
    assert fill(text, strict=False, question="Why {not}?") == \
        '{KNOWLEDGE FOR YOUR REFERENCE}\n{"answer": "x"} {{kept}} {other}\nWhy {not}?'


def test_one_loader_for_text_prompts_and_prompt_sets():
    qa = load_prompt("qa/hotpotqa")
    assert isinstance(qa, str) and "{knowledge}" in qa and qa is load_prompt("qa/hotpotqa")  # read once
    ps = load_prompt("methods/direct")
    assert isinstance(ps, PromptSet) and ps.fill("query", question="Q?").endswith("<Question>: Q?\n<Answer>:")
    assert isinstance(load_prompt("efficientrag/user_messages"), PromptSet)
    with pytest.raises(FileNotFoundError, match="no prompt 'methods/nope'.*methods/direct.*qa/hotpotqa"):
        load_prompt("methods/nope")
