"""data_synthesis.llm_steps: decomposition, token labeling and next-hop filtering driven by an LLM.

Record assembly, validation and retries are checked exactly with a scripted LLM
(a real :class:`effrag.llm.LLM` subclass replaying answers a good LLM gives for a
bundled HotpotQA question); the real SmolLM2-135M model then runs the whole path on
two bundled questions, where either valid records or a SynthesisReject with a known
reason is acceptable, never a crash.
"""
from __future__ import annotations

import json

import pytest

from data_synthesis.llm_steps import (
    LLMStepsConfig,
    SynthesisReject,
    decomposition_schema,
    synthesize_question_llm,
)
from effrag.data import load_questions, sample_path
from effrag.llm import LLM, LLMError, LLMRequestError, load_llm
from effrag.text import INFO, filter_input_words, passage_text, words


@pytest.fixture(scope="module")
def hotpot():
    return load_questions(sample_path("hotpotqa", "train"))


class ScriptedLLM(LLM):
    """Answers each step from a queue of scripted replies; records every request it receives."""

    kind = "scripted"

    def __init__(self, replies: dict[str, list[str]]):
        super().__init__(cache=False)
        self.replies = {k: list(v) for k, v in replies.items()}
        self.requests: list[tuple[str, dict]] = []

    @property
    def model_id(self) -> str:
        return "scripted"

    def _generate(self, messages, params):
        system = messages[0]["content"]
        step = ("decompose" if "decomposition task" in system else
                "label" if "information extraction" in system else "filter")
        self.requests.append((step, params))
        queue = self.replies[step]
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        cut = text.startswith("{") and not text.rstrip().endswith("}")  # an unclosed object: hit max_tokens
        finish = "length" if cut else "stop"
        return [{"text": text, "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": finish}]


Q0 = "The self-proclaimed psychic from The Antiques Ghost Show is best known for which television work?"
DECOMP = json.dumps({"question": Q0, "decomposed_questions": {
    "1": {"sub_question": "Who is the self-proclaimed psychic from The Antiques Ghost Show?",
          "answer": "Derek Acorah", "dependency": [], "document": "#1"},
    "2": {"sub_question": "Which television work is Derek Acorah best known for?",
          "answer": "Most Haunted", "dependency": ["1"], "document": "#2"}}})
LABEL1 = '{"extracted_words": "The Antiques Ghost Show self-proclaimed psychic Derek Acorah"}'
LABEL2 = '```json\n{"extracted_words": "Derek Acorah best known for his television work on \\"Most Haunted\\""}\n```'
FILTER = '{"filtered_query": "best known for which television work? Derek Acorah"}'


def test_bridge_question_records(hotpot):
    q = hotpot[0]
    assert q.question == Q0
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [LABEL1, LABEL2], "filter": [FILTER]})
    lab, filt = synthesize_question_llm(q, llm)
    assert [r["hop"] for r in lab] == [1, 2] and [r["chunk_id"] for r in lab] == q.gold_ids
    for r, p in zip(lab, q.gold):
        assert r["chunk_words"] == words(passage_text(p)) and len(r["labels"]) == len(r["chunk_words"])
        assert r["tag"] == 1 and r["source"] == "llm" and r["qid"] == q.id and r["dataset"] == "hotpotqa"
    kept1 = [w for w, l in zip(lab[0]["chunk_words"], lab[0]["labels"]) if l]
    assert kept1[:4] == ["The", "Antiques", "Ghost", "Show"] and "Acorah" in kept1 and "Gower" not in kept1
    kept2 = [w for w, l in zip(lab[1]["chunk_words"], lab[1]["labels"]) if l]
    assert {"Most", "Haunted", "television"} <= set(kept2) and "criticism" not in kept2
    # hop 1 is retrieved with the question, hop 2 with the Filter's next-hop query
    (f,) = filt
    assert lab[0]["query"] == Q0 and lab[1]["query"] == f["target"]
    assert f["words"] == words(Q0) + INFO + kept1 and len(f["labels"]) == len(f["words"])
    picked = [w for w, l in zip(f["words"], f["labels"]) if l]
    assert picked == ["best", "known", "for", "which", "television", "work", "?", "Derek", "Acorah"]
    assert f["target"] == "best known for which television work? Derek Acorah"
    assert [s for s, _ in llm.requests] == ["decompose", "label", "label", "filter"]


def test_comparison_question_is_one_hop_without_filter(hotpot):
    q = hotpot[3]  # Never Cry Wolf / Big Hero 6 (comparison)
    decomp = json.dumps({"question": q.question, "decomposed_questions": {
        "1": {"sub_question": "Which label released Never Cry Wolf?", "answer": "Walt Disney Pictures",
              "dependency": [], "document": "#1"},
        "2": {"sub_question": "Which label released Big Hero 6?", "answer": "Walt Disney Pictures",
              "dependency": [], "document": "#2"}}})
    labels = ['{"extracted_words": "Never Cry Wolf film released under Walt Disney Pictures label"}',
              '{"extracted_words": "Big Hero 6 film released by Walt Disney Pictures"}']
    llm = ScriptedLLM({"decompose": [decomp], "label": labels})
    lab, filt = synthesize_question_llm(q, llm)
    assert filt == [] and [r["hop"] for r in lab] == [1, 1] and all(r["query"] == q.question for r in lab)
    assert decomposition_schema(2, comparison=True)["properties"]["decomposed_questions"]["properties"]["1"][
        "properties"]["dependency"]["maxItems"] == 0


def test_retry_uses_new_seed_and_temperature(hotpot):
    bad = '{"extracted_words": "zebra quantum xylophone"}'  # none of these words is in the chunk
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [bad, LABEL1, LABEL2], "filter": [FILTER]})
    lab, filt = synthesize_question_llm(hotpot[0], llm, max_retries=1)
    labels_calls = [p for s, p in llm.requests if s == "label"]
    assert [(p["temperature"], p["seed"]) for p in labels_calls] == [(0.0, 0), (0.7, 1), (0.0, 0)]
    assert len(lab) == 2 and len(filt) == 1


@pytest.mark.parametrize("reply,reason", [
    (DECOMP.replace("Who is the self-proclaimed psychic from The Antiques Ghost Show?", Q0), "decompose_copied_question"),
    (DECOMP.replace('"#2"', '"#1"'), "decompose_document_mismatch"),
    (DECOMP.replace('"dependency": ["1"]', '"dependency": []'), "decompose_no_dependency"),
    (DECOMP.replace('"dependency": []', '"dependency": ["2"]'), "decompose_bad_dependency"),  # a cycle
    (DECOMP.replace("Most Haunted", "Ghostbusters"), "decompose_answer_not_in_document"),
    (DECOMP[:120], "decompose_truncated"),
    ("I think the answer is Most Haunted.", "decompose_bad_json"),
])
def test_invalid_decompositions_are_rejected_after_retries(hotpot, reply, reason):
    llm = ScriptedLLM({"decompose": [reply]})
    with pytest.raises(SynthesisReject) as e:
        synthesize_question_llm(hotpot[0], llm, max_retries=2)
    assert e.value.reason == reason
    assert len(llm.requests) == 3 and e.value.detail.count(reason) == 3


@pytest.mark.parametrize("reply,reason", [
    ('{"filtered_query": "best known for which television work?"}', "filter_no_info_words"),
    ('{"filtered_query": "Derek Acorah"}', "filter_no_question_words"),
    ('{"filtered_query": "Which famous ghost programme did Derek host on TV channel five"}', "filter_low_coverage"),
])
def test_invalid_next_hop_queries_are_rejected(hotpot, reply, reason):
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [LABEL1, LABEL2], "filter": [reply]})
    with pytest.raises(SynthesisReject, match=reason):
        synthesize_question_llm(hotpot[0], llm, max_retries=0)


def test_labels_must_keep_question_words(hotpot):
    only_answer = '{"extracted_words": "Derek Acorah"}'
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [only_answer]})
    with pytest.raises(SynthesisReject, match="label_missing_question"):
        synthesize_question_llm(hotpot[0], llm, max_retries=0)


def test_labels_must_keep_the_answer(hotpot):
    no_answer = '{"extracted_words": "The Antiques Ghost Show self-proclaimed psychic"}'
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [no_answer]})
    with pytest.raises(SynthesisReject, match="label_missing_answer"):
        synthesize_question_llm(hotpot[0], llm, max_retries=0)
    relaxed = LLMStepsConfig(max_retries=0, require_answer_words=False)
    weak_filter = '{"filtered_query": "best known for which television work? self-proclaimed psychic"}'
    llm = ScriptedLLM({"decompose": [DECOMP], "label": [no_answer, LABEL2], "filter": [weak_filter]})
    lab, filt = synthesize_question_llm(hotpot[0], llm, config=relaxed)
    assert len(lab) == 2
    assert words(filt[0]["target"]) == words("best known for which television work? self-proclaimed psychic")


class FailingLLM(ScriptedLLM):
    def __init__(self, error: Exception):
        super().__init__({})
        self.error = error

    def _generate(self, messages, params):
        raise self.error


def test_backend_errors_reject_or_propagate(hotpot):
    # a refused request (e.g. prompt longer than the context) is this question's problem: reject it
    with pytest.raises(SynthesisReject) as e:
        synthesize_question_llm(hotpot[0], FailingLLM(LLMRequestError("exceeds context window")))
    assert e.value.reason == "decompose_request_rejected"
    # an unreachable backend is not: stop the job
    with pytest.raises(LLMError, match="no answer"):
        synthesize_question_llm(hotpot[0], FailingLLM(LLMError("no answer from server")))


def test_filter_input_markers_are_never_labelled():
    ws = filter_input_words("Who directed it?", [["Jaws", "1975"], ["Spielberg"]])
    assert ws == ["Who", "directed", "it", "?", "Info", ":", "Jaws", "1975", "Info", ":", "Spielberg"]


# ---------------------------------------------------------------------------------- real SmolLM2

KNOWN_REASONS = {f"{step}_{why}" for step, whys in {
    "decompose": ["truncated", "bad_json", "missing_field", "wrong_count", "bad_document", "bad_dependency",
                  "document_mismatch", "copied_question", "answer_not_in_document", "no_dependency"],
    "label": ["truncated", "bad_json", "missing_field", "empty", "low_coverage", "everything", "missing_answer",
              "missing_question"],
    "filter": ["truncated", "bad_json", "missing_field", "low_coverage", "no_info_words", "no_question_words"],
}.items() for why in whys}


@pytest.mark.slow
@pytest.mark.llm
def test_smollm2_end_to_end_gives_records_or_reasons(hotpot, tmp_path):
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    llm = load_llm("default", cache=tmp_path / "c.sqlite", n_ctx=2048)
    def size(q):
        return sum(len(passage_text(p)) for p in q.gold)

    # the shortest bridge and comparison questions of the sample: prompt length drives the cost on CPU
    pair = [min((q for q in hotpot if q.type == t), key=size) for t in ("bridge", "comparison")]
    outcomes = []
    for q in pair:
        try:
            lab, filt = synthesize_question_llm(q, llm, max_retries=0)
        except SynthesisReject as e:
            assert e.reason in KNOWN_REASONS, e
            outcomes.append(e.reason)
            continue
        assert lab and {r["chunk_id"] for r in lab} == set(q.gold_ids)
        for r in lab:
            assert len(r["labels"]) == len(r["chunk_words"]) and any(r["labels"]) and r["tag"] == 1
        for f in filt:
            assert len(f["labels"]) == len(f["words"]) and f["target"]
        outcomes.append("ok")
    assert len(outcomes) == 2 and 2 <= llm.usage.calls <= 8
    calls = llm.usage.calls  # a rerun is served entirely from the cache
    for q in pair:
        try:
            synthesize_question_llm(q, llm, max_retries=0)
        except SynthesisReject:
            pass
    assert llm.usage.calls == calls and llm.usage.cache_hits >= 2


@pytest.mark.llm
def test_smollm2_label_and_filter_steps(hotpot, tmp_path):
    """The steps after decomposition, on the real model (a 135M model rarely passes decomposition)."""
    pytest.importorskip("llama_cpp", reason="install effrag[llm]")
    from data_synthesis.llm_steps import SubQ, filter_next_query, label_chunk

    llm = load_llm("default", cache=tmp_path / "c.sqlite", n_ctx=2048)
    cfg = LLMStepsConfig(max_retries=0)
    q = hotpot[0]
    cw = words(passage_text(q.gold[1]))
    sub = SubQ("Which television work is Derek Acorah best known for?", "Most Haunted", 1, [0])
    try:
        labels = label_chunk(sub, q.gold[1], llm, cfg)
        assert len(labels) == len(cw) and any(labels)
    except SynthesisReject as e:
        assert e.reason.startswith("label_") and e.reason in KNOWN_REASONS, e
    kept = [words("The Antiques Ghost Show self-proclaimed psychic Derek Acorah")]
    try:
        flabels = filter_next_query(q.question, kept, llm, cfg)
        src = filter_input_words(q.question, kept)
        assert len(flabels) == len(src) and any(flabels[len(words(q.question)):])
    except SynthesisReject as e:
        assert e.reason.startswith("filter_") and e.reason in KNOWN_REASONS, e
    assert llm.usage.calls == 2
