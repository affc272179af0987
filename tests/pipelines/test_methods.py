"""LLM-based methods: stop conditions, SearChain's IR decisions, and each method's control flow against the real
in-process SmolLM2 with BM25 over the bundled sample (prompts and answer extraction: test_method_prompts.py).

Stop conditions are checked by replaying recorded generations (``Replay``), since a real model cannot
be made to say "answer is" on cue; everything else (retriever, reader, prompts, the LLM in the
end-to-end tests) is the real component.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from effrag.data import Corpus, Passage, load_questions, sample_path
from effrag.llm import Completion
from effrag.pipelines import build_pipeline, get_pipeline_class
from effrag.pipelines.searchain import Node
from effrag.pipelines.self_ask import run_chain
from effrag.retrieval import BM25Retriever

METHODS = ["direct", "cot", "decompose-r", "iter-retgen", "self-ask", "ircot", "searchain", "mcr"]
READER_CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "reader-all"


class Replay:
    """Plays back recorded generations in order and keeps the prompts it was given."""

    n_ctx = 4096

    def __init__(self, outputs):
        self.outputs, self.prompts = list(outputs), []

    def chat(self, messages, **kw):
        self.prompts.append(messages[-1]["content"])
        text = self.outputs.pop(0) if self.outputs else ""
        return [Completion(text, prompt_tokens=len(messages[-1]["content"]) // 4, completion_tokens=len(text) // 4)]

    def chat_many(self, batch, **kw):
        return [self.chat(m, **kw) for m in batch]


@pytest.fixture(scope="module")
def bm25(sample_corpus):
    return BM25Retriever(sample_corpus, show_progress=False)


@pytest.fixture(scope="module")
def hotpot_dev():
    return load_questions(sample_path("hotpotqa", "dev"))


# ------------------------------------------------------------------ stop conditions (replayed generations)

def test_ircot_stops_on_answer_is_and_reads_separately(bm25, hotpot_dev):
    q = hotpot_dev[0].question
    llm = Replay(["The film was directed by someone. More text.", "So the answer is: Ed Wood.", "Ed Wood"])
    out = build_pipeline("ircot", bm25, k=2, llm=llm, dataset="hotpotqa", max_steps=8, demos=1)
    res = out.run(q)
    assert res.llm_calls == 3 and res.iterations == 2
    assert res.trace["stop_reason"] == "answer is"
    assert res.trace["cot"] == ["The film was directed by someone.", "So the answer is: Ed Wood."]
    assert res.answer == "Ed Wood" and res.extra["parse_failures"] == 0
    first_k = [h.id for h in bm25.search([q], 2)[0]]
    assert res.ids[:2] == first_k
    # the second reason-step sees the first CoT sentence after "A:"; the reader prompt uses the direct demo
    assert llm.prompts[1].rstrip().endswith("A: The film was directed by someone.")
    assert "So the answer is" not in llm.prompts[2].split("Q: " + q)[0].split("\n\n\n")[-2]


def test_ircot_caps_paragraphs_at_15(bm25, hotpot_dev):
    sentences = [f"Step {i} mentions {w}." for i, w in enumerate(
        ["American film director", "television series", "Canadian musician", "football club", "rock band",
         "novel author", "river in Europe", "album released"])]
    llm = Replay(sentences + ["no answer here"])
    res = build_pipeline("ircot", bm25, k=8, llm=llm, dataset="hotpotqa", max_steps=8, demos=0,
                         reader_prompt="cot").run(hotpot_dev[1].question)
    assert len(res.ids) == 15 and len(set(res.ids)) == 15
    assert res.trace["stop_reason"] == "max steps" and res.llm_calls == 9
    # a CoT reader without "answer is" -> the whole generation is the answer, counted as a parse failure
    assert res.answer == "no answer here" and res.extra["parse_failures"] == 1


def test_self_ask_answers_follow_ups_with_retrieval_qa_and_stops_on_final(bm25, hotpot_dev):
    q = hotpot_dev[0].question
    llm = Replay([" Yes.\nFollow up: What nationality was Scott Derrickson?",
                  '<Answer>: ```json\n{"answer": "American"}\n```',  # retrieval-QA call (Tables 14-16)
                  "Follow up: What nationality was Ed Wood?",
                  '{"answer": "American"}',
                  "So the final answer is: yes"])
    res = build_pipeline("self-ask", bm25, k=2, llm=llm, dataset="hotpotqa").run(q)
    assert res.answer == "yes" and res.llm_calls == 5 and res.extra["parse_failures"] == 0
    assert res.trace["stop_reason"] == "final answer" and res.trace["forced_final"] is None
    assert "What nationality was Scott Derrickson?" in llm.prompts[1] and "<doc>" in llm.prompts[1]
    assert llm.prompts[2].rstrip().endswith("Intermediate answer: American")
    expect = [h.id for f in ("What nationality was Scott Derrickson?", "What nationality was Ed Wood?")
              for h in bm25.search([f], 2)[0]]
    assert res.ids == list(dict.fromkeys(expect))


def test_self_ask_step_cap_forces_final_then_falls_back_to_last_intermediate(bm25, hotpot_dev):
    q = hotpot_dev[0].question
    chain = [" Yes.\nFollow up: Who was Scott Derrickson?", '{"answer": "An American director"}',
             "Follow up: Who was Ed Wood?"]
    llm = Replay(chain + [" no"])
    res = build_pipeline("self-ask", bm25, k=2, llm=llm, dataset="hotpotqa", max_follow_ups=1).run(q)
    assert res.trace["stop_reason"] == "follow-up cap" and res.llm_calls == 4
    assert llm.prompts[3].rstrip().endswith("So the final answer is:")
    assert res.answer == "no" and res.extra["parse_failures"] == 0
    res = build_pipeline("self-ask", bm25, k=2, llm=Replay(chain + [""]), dataset="hotpotqa",
                         max_follow_ups=1).run(q)
    assert res.answer == "An American director" and res.extra["parse_failures"] == 1


def test_run_chain_stops_when_no_progress():
    gens = iter([" Yes.\nFollow up: A?", "an answer", "rambling without any marker"])
    chain = run_chain(lambda p: next(gens), lambda c: "prompt", lambda q: [], max_follow_ups=4)
    assert chain.stop_reason == "no progress" and chain.final is None and len(chain.generations) == 3
    assert chain.answer == "an answer"


# ------------------------------------------------------------------ SearChain IR side with a real reader

@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    import torch
    from accelerate.state import AcceleratorState, GradientState

    from data_synthesis.reader_records import write_reader_data
    from effrag.models.reader import ExtractiveReader
    from effrag.training import load_config, train

    if (READER_CKPT / "heads.safetensors").is_file():
        return ExtractiveReader.from_pretrained(READER_CKPT)
    root = tmp_path_factory.mktemp("reader")  # no trained checkpoint here: a few real steps of the shared loop
    write_reader_data([sample_path(d, "train") for d in ("hotpotqa", "2wikimqa", "musique")], root / "data", limit=6)
    threads = torch.get_num_threads()
    try:
        res = train(load_config("reader", {"model": {"max_length": 128},
                                           "data": {"train_file": str(root / "data" / "reader.jsonl"), "eval_files": []},
                                           "train": {"output_dir": str(root / "run"), "max_steps": 2, "batch_size": 4,
                                                     "log_every": 1}}))
    finally:  # the loop's process-wide settings: accelerate's singleton state, the config's torch_threads
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        torch.set_num_threads(threads)
    losses = [r["train/loss"] for r in map(json.loads, (root / "run" / "log.jsonl").read_text().splitlines())
              if "train/loss" in r]
    assert res["global_step"] == 2 and len(losses) == 2 and all(x == x for x in losses)
    return ExtractiveReader.from_pretrained(root / "run" / "last")


@pytest.fixture(scope="module")
def handmade():
    docs = [Passage.make("Kevin Drew", "Kevin Drew (born September 9, 1976 in Toronto) is a Canadian musician."),
            Passage.make("Toronto Coach Terminal", "The Toronto Coach Terminal is the central bus station for "
                         "inter-city services in Toronto, used by Greyhound Canada."),
            Passage.make("Spirit If...", "Spirit If... is the debut solo album by Kevin Drew.")]
    return BM25Retriever(Corpus(docs), show_progress=False)


def _searchain(handmade, reader, llm=None, **kw):
    return build_pipeline("searchain", handmade, llm=llm or Replay([]), reader=reader, **kw)


def test_searchain_verification_decisions(handmade, reader):
    q, node_q = "Where do greyhound buses in the birthplace of Spirit If...'s performer leave from?", \
        "Where was Kevin Drew born?"
    doc = handmade.search([node_q], 1)[0][0]
    g = reader.predict([node_q], [doc.text])[0]
    assert g.text and g.text in doc.text
    sc = _searchain(handmade, reader, theta=g.confidence - 1.0)  # reader confident enough
    fb = sc.check_node(q, Node(node_q, "Vancouver"))
    assert fb.kind == "verify" and fb.doc.id == doc.id and fb.recorded_answer == g.text
    assert f'should be "{g.text}"' in fb.message and doc.text in fb.message and q in fb.message
    assert sc.check_node(q, Node(node_q, f"He was born in {g.text}.")).kind == "pass"  # consistent answer
    sc = _searchain(handmade, reader, theta=g.confidence + 1.0)  # not confident enough: keep the LLM's answer
    fb = sc.check_node(q, Node(node_q, "Vancouver"))
    assert fb.kind == "pass" and fb.recorded_answer == "Vancouver"
    fb = sc.check_node(q, Node(node_q, None, unsolved=True))  # completion ignores the threshold
    assert fb.kind == "complete" and "you can give your answer" in fb.message and fb.recorded_answer == g.text


def test_searchain_rounds_completion_then_tracing_with_references(handmade, reader):
    q = "Where do greyhound buses in the birthplace of Spirit If...'s performer leave from?"
    round1 = "[Query 1]: Who is the performer of Spirit If...?\n[Answer 1]: Kevin Drew\n" \
             "[Unsolved Query]: Where was Kevin Drew born?"
    round2 = "[Query 1]: Who is the performer of Spirit If...?\n[Answer 1]: Kevin Drew\n" \
             "[Query 2]: Where was Kevin Drew born?\n[Answer 2]: Toronto\n[Final Content]: So the final answer is x."
    trace = "[Final Content]: Spirit If... is by Kevin Drew [1]. He was born in Toronto [2]. " \
            "So the final answer is Toronto Coach Terminal."
    llm = Replay([round1, round2, trace])
    res = _searchain(handmade, reader, llm=llm, theta=100.0, max_rounds=3).run(q)
    assert res.llm_calls == 3 and res.iterations == 2
    assert [r["feedback"] for r in res.trace["rounds"]] == ["complete", "finish"]
    assert llm.prompts[1].startswith("According to this Reference, the answer for \"Where was Kevin Drew born?\"")
    assert res.answer == "Toronto Coach Terminal" and res.extra["parse_failures"] == 0
    kinds = [n["kind"] for n in res.trace["nodes"]]
    assert kinds == ["pass", "complete"]  # the repeated node 2 of round 2 was already processed
    ids = [n["doc"] for n in res.trace["nodes"]]
    assert res.ids == list(dict.fromkeys(ids))
    assert f"[Reference: {ids[0]}]" in res.trace["final_content"]
    assert f"[Reference: {ids[1]}]" in res.trace["final_content"]


@pytest.mark.skipif(not (READER_CKPT / "heads.safetensors").is_file(), reason="no trained reader checkpoint")
def test_trained_reader_answers_and_ranks_confidence(reader):
    ans, other = reader.predict(["Where was Kevin Drew born?"] * 2,
                                ["Kevin Drew (born September 9, 1976 in Toronto) is a Canadian musician.",
                                 "The Toronto Coach Terminal is the central bus station in Toronto."])
    assert ans.text == "Toronto" and ans.confidence > other.confidence


# ------------------------------------------------------------------ registry and CLI options

@pytest.mark.parametrize("name", METHODS)
def test_cli_options_reach_the_constructor(name, bm25, reader):
    cls = get_pipeline_class(name)
    parser = argparse.ArgumentParser()
    before = {a.dest for a in parser._actions}
    cls.add_args(parser)
    opts = {a.dest: a.default for a in parser._actions if a.dest not in before}
    opts["llm"] = Replay([])
    if name == "searchain":
        opts["reader"] = reader
    p = build_pipeline(name, bm25, k=3, **opts)
    assert p.name == name


# ------------------------------------------------------------------ control flow with the real SmolLM2

@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    from effrag.llm import load_llm

    # one thread: on shared cores llama.cpp's spinning worker threads slow everything down
    return load_llm("default", cache=str(tmp_path_factory.mktemp("llmcache") / "cache.sqlite"),
                    n_threads=int(os.environ.get("EFFRAG_LLM_THREADS", "1")))


# Tiny prompts and caps: the point is the control flow against a real model, not its answers.
REAL = {
    "direct": dict(max_tokens=16, n_examples=1),
    "cot": dict(max_tokens=32, n_examples=1),
    "decompose-r": dict(k=1, max_tokens=40, answer_max_tokens=12, max_chunks=3),
    "iter-retgen": dict(k=1, max_tokens=24, iterations=2, n_examples=1),
    "self-ask": dict(k=1, max_tokens=24, max_follow_ups=1, n_examples=1, answer_max_tokens=12),
    "ircot": dict(k=1, max_tokens=24, max_steps=1, demos=1, distractors=0, max_paragraph_words=30),
    "searchain": dict(max_tokens=48, max_rounds=1),
    "mcr": dict(max_tokens=24, chains=2, max_follow_ups=1, n_examples=1, meta_max_tokens=16, snippet_words=20),
}
CALL_BOUNDS = {"direct": (1, 1), "cot": (1, 1), "decompose-r": (2, 2), "iter-retgen": (2, 2),
               "self-ask": (1, 6), "ircot": (2, 2), "searchain": (1, 2), "mcr": (3, 9)}


@pytest.mark.llm
@pytest.mark.parametrize("name", METHODS)
def test_method_runs_with_real_llm(name, smollm, bm25, hotpot_dev, reader):
    opts = dict(REAL[name], llm=smollm, dataset="hotpotqa")
    if name == "searchain":
        opts["reader"] = reader
    res = build_pipeline(name, bm25, **opts).run(hotpot_dev[2].question)
    lo, hi = CALL_BOUNDS[name]
    assert lo <= res.llm_calls <= hi, res.llm_calls
    assert res.prompt_tokens > 0 and res.completion_tokens > 0
    assert isinstance(res.answer, str) and res.extra["parse_failures"] >= 0
    assert len(res.ids) == len(set(res.ids)) == len(res.scores)
    if name in ("direct", "cot"):
        assert res.ids == []
    elif name == "self-ask":  # retrieval happens only for follow-up questions the model asked
        assert bool(res.ids) == bool(res.trace["follow_ups"])
    elif name == "searchain":  # and only for Chain-of-Query nodes it wrote
        assert bool(res.ids) == bool(res.trace["nodes"])
    else:
        assert res.ids and len(res.ids) <= 15
    json.dumps(res.to_row())  # predictions.jsonl rows must serialise


def test_searchain_without_query_nodes_answers_from_the_generation(handmade, reader):
    llm = Replay(["I think the answer is: Toronto Coach Terminal."])
    res = _searchain(handmade, reader, llm=llm).run("Where do greyhound buses in Toronto leave from?")
    assert res.llm_calls == 1 and res.ids == []  # nothing to verify, no tracing call
    assert res.answer == "Toronto Coach Terminal" and res.extra["parse_failures"] == 2
