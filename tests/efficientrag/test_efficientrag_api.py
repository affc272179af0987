"""EfficientRAG behind its one door: the registered pipeline with the ``effrag eval`` flags, the public API object
(the same class), answer generation and ``effrag eval --method efficientrag``.

Real tiny Labeler/Filter checkpoints (tests/conftest.py) over real BM25 on a slice of the bundled HotpotQA sample.
"""
from __future__ import annotations

import argparse
import json

import pytest
from helpers import fixed_heads

from effrag.data import sample_path
from effrag.pipelines.answers import parse_answer
from effrag.pipelines.efficientrag import EfficientRAGConfig
from effrag.pipelines.generation import Generator, format_knowledge, parse_judgement, prompt_name
from effrag.prompts import fill

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# ---------------------------------------------------------------------- pipeline registry and API

def test_registered_pipeline_with_eval_flags(model_dirs, retriever, questions):
    from effrag.pipelines import build_pipeline, get_pipeline_class

    cls = get_pipeline_class("efficientrag")
    parser = argparse.ArgumentParser()
    cls.add_args(parser)
    args = parser.parse_args(["--labeler", str(model_dirs["labeler"]), "--filter", str(model_dirs["filter"]),
                              "--tag-threshold", "0.0", "--token-threshold", "0.6", "--filter-threshold", "0.4",
                              "--max-hops", "2", "--query-mode", "per_chunk", "--hop-k", "2"])
    pipe = build_pipeline("efficientrag", retriever, **vars(args))
    cfg = pipe.config
    assert (cfg.tag_threshold, cfg.token_threshold, cfg.filter_threshold, cfg.max_hops, cfg.query_mode,
            cfg.hop_k) == (0.0, 0.6, 0.4, 2, "per_chunk", 2)
    outs = [o.to_row() for o in pipe.run_batch(questions[:2])]  # as predictions.jsonl records them
    assert outs[0]["retrieved"] == pipe.run(questions[0]).ids
    for o in outs:
        assert o["iterations"] == 2 and o["llm_calls"] == 0 and "answer" not in o
        assert len(o["retrieved"]) == len(o["scores"]) == 2 + 2 * 2  # everything continues
        assert [e["hop"] for e in o["trace"]["hops"]] == [0, 1]
        assert set(o["timing"]) >= {"retrieval", "labeler", "filter", "other", "total"}
    with pytest.raises(ValueError, match="both --labeler DIR and --filter DIR"):
        build_pipeline("efficientrag", retriever, labeler=str(model_dirs["labeler"]))
    with pytest.raises(ValueError, match="not both"):
        build_pipeline("efficientrag", retriever, labeler=str(model_dirs["labeler"]), filter=str(model_dirs["filter"]),
                       model="efficientrag-all")


def test_api_round_trip(model_dirs, retriever, questions):
    from effrag.api import EfficientRAG, Result

    rag = EfficientRAG.from_pretrained(model_dirs["labeler"], model_dirs["filter"], retriever=retriever,
                                       tag_threshold=0.0, max_hops=2, hop_k=2)
    one = rag.retrieve(questions[0])
    assert isinstance(one, Result) and len(one) == 2 + 2 and one.iterations == 2
    assert one.hops[0]["queries"] == [questions[0]] and one.ids == [c.id for c in one]
    best = max(one.hops[0]["chunks"], key=lambda c: c["p_continue"])
    assert (one[0].hop, one[0].id, one[0].title) == (0, best["id"], best["title"]) and one[0].text
    batch = rag.retrieve_batch(questions[:3])
    assert batch[0].ids == one.ids and len(batch) == 3
    with pytest.raises(TypeError, match="list of questions"):
        rag.retrieve_batch("one question")


def test_api_accepts_a_plain_function_as_retriever(models, retriever, questions):
    from effrag.api import EfficientRAG

    calls = []

    def search(queries, k):
        calls.append((list(queries), k))
        return [[{"id": h.id, "title": h.title, "text": h.text, "score": h.score} for h in hits]
                for hits in retriever.search(queries, k)]

    lab, fil = fixed_heads(models, tag=20.0)
    rag = EfficientRAG(search, labeler=lab, filter=fil, config=EfficientRAGConfig(hop_k=2, max_hops=2))
    got = rag.retrieve(questions[0])
    assert len(got) == 4 and calls[0] == ([questions[0]], 2)
    bad = EfficientRAG(lambda qs, k: [[{"title": "x"}] for _ in qs], labeler=lab, filter=fil)
    with pytest.raises(ValueError, match=r"hit 0 of query 0 lacks field\(s\) \['id', 'text'\]"):
        bad.retrieve(questions[0])


# ---------------------------------------------------------------------- generation

CHUNKS = [{"id": "a", "title": "Dimond Center", "text": "The Dimond Center is a mall in Anchorage {big}.",
           "kept_words": ["Dimond", "Center", "mall"]},
          {"id": "b", "title": "KGOT", "text": "KGOT has its studios in the Dimond Center.", "kept_words": []}]


@pytest.mark.parametrize("dataset,marker", [("hotpotqa", "Little Richard"), ("musique", "John Cranley"),
                                            ("2wikimqa", "Blind Shaft"), ("HotpotQA", "Little Richard")])
def test_paper_prompt_per_dataset(dataset, marker):
    g = Generator(llm="default", dataset=dataset)
    p = g.build_prompt("How large is the {mall}?", CHUNKS)
    assert marker in p and '{"answer": ' in p and "{KNOWLEDGE FOR YOUR REFERENCE}" in p
    assert p.endswith("<doc>\nDimond Center: The Dimond Center is a mall in Anchorage {big}.\n"
                      "KGOT: KGOT has its studios in the Dimond Center.\n</doc>\n"
                      "<Question>: How large is the {mall}?\n<Answer>:")


def test_default_prompt_and_context_compression():
    assert prompt_name("bamboogle") == prompt_name(None) == "qa/default"
    p = Generator(llm="default", dataset="bamboogle", context="kept_words", with_titles=False).build_prompt("Q?", CHUNKS)
    assert "examples" not in p and "\nDimond Center mall\nKGOT has its studios in the Dimond Center.\n" in p
    assert format_knowledge(CHUNKS[:1]) == "Dimond Center: The Dimond Center is a mall in Anchorage {big}."
    assert Generator(llm="default", max_chunks=1).build_prompt("Q?", CHUNKS).count("KGOT:") == 0
    with pytest.raises(ValueError, match="context"):
        Generator(llm="default", context="summary")
    assert fill("{question} {knowledge} {other}", strict=False, question="{knowledge}", knowledge="K") == \
        "{knowledge} K {other}"


# Generations recorded from SmolLM2-135M-Instruct on the bundled samples, and the paper's format.
RECORDED = [
    ("The answer is:\n<doc>\nEnemmy\n</doc>", "Enemmy"),
    ("The answer to your question is: The Zone (2017 Film)", "The Zone (2017 Film)"),
    ('The answer to the question is:\n<doc>\n2016-07-31 20:58:49.188\n```json\n{"answer": "2016-07-31"}\n```',
     "2016-07-31"),
    ('```json\n{"answer": "Little Richard"}\n```', "Little Richard"),
    ('<Answer>:\n```json\n{"answer": "1979"}\n```\nThe knowledge says 1979.', "1979"),
    ('```json\n{"answer": "The Mask Of Fu Manchu', "The Mask Of Fu Manchu"),  # cut by max_tokens
    ("Answer: eastern tip", "eastern tip"),
    ("The answer is: John Cranley", "John Cranley"),
    ("{'answer': 'Chinua Achebe'}", "Chinua Achebe"),
    ('{"answer": 2001}', "2001"),
    ('```json\n{"thought": "no idea"}\n```', ""),
    ("Anchorage, Alaska\nIt is a city.", "Anchorage, Alaska"),
    ("", ""),
]


@pytest.mark.parametrize("text,expected", RECORDED)
def test_parse_answer_on_recorded_generations(text, expected):
    assert parse_answer(text, sentences=False)[0] == expected  # as the shared QA generator reads answers


def test_parse_judgement():
    assert parse_judgement('```json\n{"response": "yes"}\n```') is True
    assert parse_judgement('{"response": "no"}') is False
    assert parse_judgement('"response": "Yes') is True
    assert parse_judgement("No, the prediction is wrong.") is False


@pytest.mark.llm
def test_real_smollm2_answer_and_judge(model_dirs, retriever, questions):
    pytest.importorskip("llama_cpp")
    from effrag.api import EfficientRAG
    from effrag.llm import load_llm
    from effrag.pipelines.generation import judge_answer

    llm = load_llm("default", cache=False)
    prompts = []

    class Recording:  # the real model, keeping the prompts it is sent
        def chat_many(self, batch, **kw):
            prompts.extend(m[-1]["content"] for m in batch)
            return llm.chat_many(batch, **kw)

    rag = EfficientRAG.from_pretrained(model_dirs["labeler"], model_dirs["filter"], retriever=retriever,
                                       tag_threshold=0.0, max_hops=1, hop_k=2)
    out = rag.answer(questions[0], llm=Recording(), dataset="hotpotqa", max_tokens=16)
    raw = out.generation["raw"]
    assert out.llm_calls == 1 and out.prompt_tokens > 200
    assert out.completion_tokens >= 1 and out.answer == parse_answer(raw, sentences=False)[0]
    assert prompts[0].count("<doc>\n") == 4 and out.chunks[0].title in prompts[0]
    ok, gen = judge_answer(llm, "What is the capital of France?", "Paris", ["Paris"])
    assert isinstance(ok, bool) and gen.prompt.startswith("You are an experienced linguist")


def test_effrag_eval_cli_runs_efficientrag(model_dirs, tmp_path):
    from effrag.cli import main

    lines = sample_path("hotpotqa", "dev").read_text(encoding="utf-8").splitlines()[:12]
    qfile = tmp_path / "dev.jsonl"
    qfile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    argv = ["eval", "--method", "efficientrag", "--questions", str(qfile), "--corpus-from", str(qfile),
            "--retriever", "bm25", "--cache-dir", str(tmp_path / "cache"), "--output", str(out), "--limit", "3",
            "--labeler", str(model_dirs["labeler"]), "--filter", str(model_dirs["filter"]),
            "--tag-threshold", "0", "--max-hops", "2", "--hop-k", "2", "--query-mode", "merged"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["retrieved"]) == 4 and r["iterations"] == 2 for r in rows)
    assert all(r["trace"]["hops"][0]["queries"] == [r["question"]] for r in rows)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics[0]["method"] == "efficientrag" and metrics[0]["avg_chunks"] == 4
    run = json.loads((out / "config.json").read_text())["run"]
    assert run["method_options"]["tag_threshold"] == 0.0
    from effrag.tuning import model_fingerprint  # a Labeler or Filter retrained at the same path: no resume

    assert run["model_files"] == {"labeler": model_fingerprint(model_dirs["labeler"]),
                                  "filter": model_fingerprint(model_dirs["filter"])}
    assert None not in run["model_files"].values()

    # hop_k from an --er-config file is kept unless --k is given explicitly
    cfg = tmp_path / "best.json"
    cfg.write_text(json.dumps({"config": {"hop_k": 2, "max_hops": 1, "tag_threshold": 0.0}}))
    base = argv[:argv.index("--tag-threshold")] + ["--er-config", str(cfg), "--overwrite"]
    for extra, hop_k in (([], 2), (["--k", "3"], 3)):
        assert main(base + extra) == 0
        run = json.loads((out / "config.json").read_text())["run"]
        assert run["method_config"]["hop_k"] == hop_k
        rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        assert all(len(r["retrieved"]) == hop_k for r in rows)


def test_a_folder_that_is_not_a_system_names_only_shipped_systems(tmp_path):
    """Issue #46, 11: the --model error listed reader-all (a reader) among the systems."""
    from effrag.pipelines.efficientrag.system import system_root

    with pytest.raises(FileNotFoundError, match=r"not an EfficientRAG system folder") as e:
        system_root(tmp_path)
    assert "efficientrag-all" in str(e.value) and "reader-all" not in str(e.value)
    assert system_root("efficientrag-all").name == "efficientrag-all"
