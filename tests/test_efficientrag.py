"""EfficientRAG inference: the loop, the pipeline, the public API and answer generation.

The Labeler and Filter are real (tiny, randomly initialised BERT encoders with the
all-MiniLM-L6-v2 tokenizer, saved and loaded through their checkpoint format);
where a test needs a fixed decision it sets a head's weights to zero and its bias
to a large value, which makes the real model always continue / keep / drop.
Retrieval is real BM25 over a slice of the bundled HotpotQA sample.
"""
from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from effrag.data import Corpus, load_questions, sample_path
from effrag.pipelines.efficientrag import (CONTINUE, TERMINATE, EfficientRAGConfig, EfficientRAGLoop,
                                           build_config, chunk_text, filter_input_words)
from effrag.pipelines.answers import parse_answer
from effrag.pipelines.generation import Generator, format_knowledge, parse_judgement, prompt_name
from effrag.prompts import fill
from effrag.text import join_words, words

N_QUESTIONS = 5


# ---------------------------------------------------------------------- fixtures

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def hotpot():
    qs = load_questions(sample_path("hotpotqa", "dev"))[:40]
    return qs


@pytest.fixture(scope="module")
def retriever(hotpot):
    from effrag.retrieval import build_retriever

    return build_retriever("bm25", Corpus.from_questions(hotpot), show_progress=False)


@pytest.fixture(scope="module")
def questions(hotpot):
    return [q.question for q in hotpot[:N_QUESTIONS]]


@pytest.fixture(scope="module")
def model_dirs(tiny_efficientrag_dirs):
    """A tiny Labeler and Filter saved in the effrag checkpoint format (tests/conftest.py)."""
    return tiny_efficientrag_dirs


@pytest.fixture(scope="module")
def models(model_dirs):
    """The saved models loaded once (round trip through from_pretrained), with their original head weights."""
    from effrag.models import FilterModel, LabelerModel

    lab = LabelerModel.from_pretrained(model_dirs["labeler"]).eval()
    fil = FilterModel.from_pretrained(model_dirs["filter"]).eval()
    heads = {"tag": lab.chunk_head.proj, "token": lab.token_head.proj, "filt": fil.token_head.proj}
    original = {k: (m.weight.detach().clone(), m.bias.detach().clone()) for k, m in heads.items()}
    return lab, fil, heads, original


def load(models, tag=None, token=None, filt=None):
    """The models with each head either original or fixed: ``+20`` always keeps/continues, ``-20`` never."""
    lab, fil, heads, original = models
    with torch.no_grad():
        for name, margin in (("tag", tag), ("token", token), ("filt", filt)):
            w, b = original[name]
            heads[name].weight.copy_(w if margin is None else torch.zeros_like(w))
            heads[name].bias.copy_(b if margin is None else torch.tensor([0.0, margin]))
    return lab, fil


def make_loop(models, retriever, tag=None, token=None, filt=None, **cfg):
    lab, fil = load(models, tag, token, filt)
    return EfficientRAGLoop(lab, fil, retriever, EfficientRAGConfig(**{"hop_k": 3, **cfg}))


def split_point(values: list[float]) -> float:
    """A threshold in the widest gap among the middle values (far from every value: robust to batching noise)."""
    v = sorted(values)
    lo, hi = len(v) // 4, max(len(v) // 4 + 1, 3 * len(v) // 4)
    i = max(range(lo, hi), key=lambda j: v[j + 1] - v[j])
    return (v[i] + v[i + 1]) / 2


def labeled_ids(result):
    return [c["id"] for e in result.hops for c in e["chunks"]]


# ---------------------------------------------------------------------- the loop

def test_all_terminate_stops_after_hop_zero(models, retriever, questions):
    loop = make_loop(models, retriever, tag=-20.0, max_hops=4)
    for r in loop.run(questions):
        assert r.iterations == 1 and len(r.hops) == 1
        assert r.chunks == []
        hop = r.hops[0]
        assert hop["stop"] == "no_continue" and hop["next_queries"] == [] and hop["filter_inputs"] == []
        assert len(hop["chunks"]) == 3 and all(c["tag"] == TERMINATE for c in hop["chunks"])


def test_all_continue_runs_exactly_max_hops_and_ranks_by_hop_then_score(models, retriever, questions):
    loop = make_loop(models, retriever, tag=20.0, max_hops=3)
    for r in loop.run(questions):
        assert r.iterations == 3 and [e["hop"] for e in r.hops] == [0, 1, 2]
        assert r.hops[-1]["stop"] == "max_hops" and r.hops[-1]["next_queries"] == []
        assert [c.id for c in r.chunks] and len(r.chunks) == len(labeled_ids(r))
        keys = [(c.hop, -c.score) for c in r.chunks]
        assert keys == sorted(keys)
        assert all(c.score > 0.99 and not c.fallback for c in r.chunks)


@pytest.mark.parametrize("max_hops", [1, 2])
def test_max_hops_is_respected(models, retriever, questions, max_hops):
    r = make_loop(models, retriever, tag=20.0, max_hops=max_hops).run(questions[:2])[0]
    assert r.iterations == max_hops and len(r.hops) == max_hops


def test_tag_threshold_extremes_on_an_unbiased_model(models, retriever, questions):
    everything = make_loop(models, retriever, tag_threshold=0.0, max_hops=3).run(questions)
    assert all(r.iterations == 3 and len(r.chunks) == len(labeled_ids(r)) for r in everything)
    nothing = make_loop(models, retriever, tag_threshold=1.0, max_hops=3).run(questions)
    assert all(r.iterations == 1 and r.chunks == [] for r in nothing)


def test_no_chunk_is_labeled_twice_and_refill_gives_k_new_chunks(models, retriever, questions):
    for mode in ("merged", "per_chunk"):
        results = make_loop(models, retriever, tag=20.0, max_hops=3, query_mode=mode).run(questions[:3])
        for r in results:
            ids = labeled_ids(r)
            assert len(ids) == len(set(ids)), f"{mode}: a chunk was labeled twice"
            for e in r.hops:  # BM25 over 400 passages has plenty of unseen hits for these queries
                assert all(len(got) == 3 for got in e["retrieved"]), e["retrieved"]
    drop = make_loop(models, retriever, tag=20.0, max_hops=3, dedup="drop").run(questions[:3])
    refill = make_loop(models, retriever, tag=20.0, max_hops=3, dedup="refill").run(questions[:3])
    for d, f in zip(drop, refill):
        assert len(set(labeled_ids(d))) == len(labeled_ids(d))
        assert len(labeled_ids(d)) <= len(labeled_ids(f))
    assert any(e["skipped_seen"] > 0 for d in drop for e in d.hops[1:])


def test_trace_explains_every_decision(models, retriever, questions):
    loop = make_loop(models, retriever, tag_threshold=0.5, max_hops=3)
    for q, r in zip(questions, loop.run(questions)):
        assert r.hops[0]["queries"] == [q]
        for prev, nxt in zip(r.hops, r.hops[1:]):
            assert nxt["queries"] == prev["next_queries"]
        by_id = {c.id: c for c in r.chunks}
        for e in r.hops:
            assert sum(len(x) for x in e["retrieved"]) == len(e["chunks"])
            for c in e["chunks"]:
                assert (c["tag"] == CONTINUE) == (c["id"] in by_id)
                if c["tag"] == CONTINUE:
                    chunk = by_id[c["id"]]
                    assert chunk.score >= 0.5
                    assert chunk.hop == e["hop"] and abs(chunk.score - c["p_continue"]) < 1e-4
                    assert c["kept"] == join_words(chunk.kept_words)
                    assert chunk.query == e["queries"][c["query"]]
                    source = set(words(chunk_text(chunk.title, chunk.text)))
                    assert set(chunk.kept_words) <= source
                else:
                    assert c["kept"] == ""
        assert set(r.timing) == {"retrieval", "labeler", "filter", "other", "total"}
        assert r.timing["labeler"] > 0 and abs(sum(v for k, v in r.timing.items() if k != "total")
                                               - r.timing["total"]) < 1e-9


def test_query_chunks_caps_the_chunks_that_feed_the_merged_query(models, retriever, questions):
    q = questions[0]
    full = make_loop(models, retriever, tag=20.0, token=20.0, filt=20.0, max_hops=2).run([q])[0]
    hop0 = [c for c in sorted(full.chunks, key=lambda c: -c.score) if c.hop == 0]
    assert len(hop0) == 3
    for m in (1, 2):  # the m most confident <Continue> chunks give the merged query's Info blocks
        r = make_loop(models, retriever, tag=20.0, token=20.0, filt=20.0, max_hops=2, query_chunks=m).run([q])[0]
        assert r.hops[0]["filter_inputs"] == [join_words(filter_input_words(q, [c.kept_words for c in hop0[:m]]))]
    with pytest.raises(ValueError, match="query_chunks"):
        EfficientRAGConfig(query_chunks=0)
    assert "query_chunks" not in EfficientRAGConfig().to_json()  # old configs still match


def test_token_and_filter_thresholds_shape_the_next_query(models, retriever, questions):
    q = questions[0]
    # Labeler keeps every word, Filter keeps every word: next query = the whole filter input
    r = make_loop(models, retriever, tag=20.0, token=20.0, filt=20.0, max_hops=2).run([q])[0]
    conts = sorted(r.chunks, key=lambda c: -c.score)
    hop0 = [c for c in conts if c.hop == 0]
    assert all(c.kept_words == words(chunk_text(c.title, c.text)) for c in hop0)
    expected = filter_input_words(q, [c.kept_words for c in hop0])
    assert r.hops[0]["filter_inputs"] == [join_words(expected)]
    assert r.hops[0]["next_queries"] == [join_words(expected)]
    # Labeler keeps nothing, Filter drops everything: fall back to the query itself
    r = make_loop(models, retriever, tag=20.0, token=-20.0, filt=-20.0, max_hops=2).run([q])[0]
    assert all(c.kept_words == [] for c in r.chunks)
    assert r.hops[0]["next_queries"] == [join_words(words(q))]
    # Filter keeps only... nothing but the document fallback carries the kept words on
    r = make_loop(models, retriever, tag=20.0, token=20.0, filt=-20.0, max_hops=2, query_mode="per_chunk",
                  max_branches=2).run([q])[0]
    top = sorted([c for c in r.chunks if c.hop == 0], key=lambda c: -c.score)[:2]
    assert r.hops[0]["next_queries"] == [join_words(words(q) + c.kept_words) for c in top]


def test_query_modes(models, retriever, questions):
    merged = make_loop(models, retriever, tag=20.0, max_hops=3, query_mode="merged").run(questions)
    assert all(len(e["queries"]) == 1 for r in merged for e in r.hops)
    per = make_loop(models, retriever, tag=20.0, max_hops=3, query_mode="per_chunk",
                    max_branches=2).run(questions)
    for r in per:
        assert [len(e["queries"]) for e in r.hops][0] == 1
        assert all(1 <= len(e["queries"]) <= 2 for e in r.hops[1:])
        assert any(len(e["queries"]) == 2 for e in r.hops[1:])


def test_candidate_caps(models, retriever, questions):
    capped = make_loop(models, retriever, tag=20.0, max_hops=2, max_candidates=4).run(questions)
    assert all(len(r.chunks) == 4 for r in capped)
    topped = make_loop(models, retriever, tag=-20.0, max_hops=2, min_candidates=2).run(questions)
    for r in topped:
        assert len(r.chunks) == 2 and all(c.fallback for c in r.chunks)
        assert {c.id for c in r.chunks} <= set(labeled_ids(r))


def test_fused_pool_order_keeps_what_the_retriever_is_sure_of(models, retriever, questions):
    kw = dict(max_hops=3, tag_threshold=0.0)
    by_hop = make_loop(models, retriever, **kw).run(questions)
    fused = make_loop(models, retriever, pool_order="fused", retrieval_weight=1.0, **kw).run(questions)
    heavy = make_loop(models, retriever, pool_order="fused", retrieval_weight=1e6, **kw).run(questions)
    for a, b, c in zip(by_hop, fused, heavy):
        assert sorted(x.id for x in a.chunks) == sorted(x.id for x in b.chunks)  # same pool, other order
        keys = [x.score + x.retrieval_score for x in b.chunks]
        assert keys == sorted(keys, reverse=True)
        # a dominant weight ranks by BM25 score alone, across hops
        assert [x.retrieval_score for x in c.chunks] == sorted((x.retrieval_score for x in c.chunks), reverse=True)
    capped = make_loop(models, retriever, pool_order="fused", retrieval_weight=1e6, max_candidates=3, **kw).run(questions)
    for c, r in zip(heavy, capped):  # the cap keeps the head of that order
        assert [x.id for x in r.chunks] == [x.id for x in c.chunks[:3]]
    assert any([x.hop for x in r.chunks] != sorted(x.hop for x in r.chunks) for r in heavy)
    logit = make_loop(models, retriever, pool_order="fused_logit", retrieval_weight=1.0, **kw).run(questions)
    for a, b in zip(by_hop, logit):
        assert sorted(x.id for x in a.chunks) == sorted(x.id for x in b.chunks)
        ps = [min(max(x.score, 1e-6), 1 - 1e-6) for x in b.chunks]  # log-odds, clipped as the loop clips
        keys = [math.log(p / (1 - p)) + x.retrieval_score for p, x in zip(ps, b.chunks)]
        assert keys == sorted(keys, reverse=True)
    with pytest.raises(ValueError, match="pool_order"):
        EfficientRAGConfig(pool_order="random")


def test_first_hop_k_reads_deeper_for_the_question_only(models, retriever, questions):
    res = make_loop(models, retriever, tag=20.0, token=20.0, max_hops=2, hop_k=2, first_hop_k=5).run(questions)
    for r in res:
        assert [len(ids) for ids in r.hops[0]["retrieved"]] == [5]
        assert r.hops[0]["retrieved"][0] == [h.id for h in retriever.search([r.question], 5)[0]]
        assert all(len(ids) <= 2 for e in r.hops[1:] for ids in e["retrieved"])
        assert any(ids for e in r.hops[1:] for ids in e["retrieved"])
    with pytest.raises(ValueError, match="first_hop_k"):
        EfficientRAGConfig(first_hop_k=0)


def test_seen_pool_source_ranks_every_labeled_chunk(models, retriever, questions):
    kw = dict(max_hops=2, pool_order="fused", retrieval_weight=0.5)
    paper = make_loop(models, retriever, **kw).run(questions)
    seen = make_loop(models, retriever, pool_source="seen", **kw).run(questions)
    for a, b in zip(paper, seen):
        # the same loop (tags steer it alike), but the pool is every chunk the Labeler read, in one order
        assert a.hops == b.hops
        assert sorted(c.id for c in b.chunks) == sorted(labeled_ids(b))
        keys = [c.score + 0.5 * c.retrieval_score for c in b.chunks]
        assert keys == sorted(keys, reverse=True)
        assert {c.id for c in b.chunks if not c.fallback} == {c.id for c in a.chunks}
        assert all((c.score >= 0.5) != c.fallback for c in b.chunks)
    assert any(any(c.fallback for c in r.chunks[:3]) for r in seen)  # a <Terminate> chunk can outrank a <Continue> one
    capped = make_loop(models, retriever, pool_source="seen", max_candidates=3, **kw).run(questions)
    for c, r in zip(seen, capped):
        assert [x.id for x in r.chunks] == [x.id for x in c.chunks[:3]]
    with pytest.raises(ValueError, match="pool_source"):
        EfficientRAGConfig(pool_source="everything")


def test_requery_weight_adds_the_later_queries_scores_to_the_fused_order(models, retriever, questions):
    class Recording:  # the retriever as the loop calls it: every query's hits, in order
        def __init__(self):
            self.calls = []

        def search(self, queries, k):
            out = retriever.search(queries, k)
            self.calls += list(zip(queries, out))
            return out

    kw = dict(max_hops=3, tag_threshold=0.0, token_threshold=0.0, pool_source="seen", pool_order="fused_logit",
              retrieval_weight=0.5)
    plain = make_loop(models, retriever, **kw).run(questions)
    rec = Recording()
    lab, fil = load(models, None, None, None)
    heavy = EfficientRAGLoop(lab, fil, rec, EfficientRAGConfig(hop_k=3, requery_weight=1e6, **kw)).run(questions)
    assert not any("requery_scores" in r.extra for r in plain)
    moved = 0
    for a, b in zip(plain, heavy):
        assert a.hops == b.hops and sorted(c.id for c in a.chunks) == sorted(c.id for c in b.chunks)
        later = [q for e in b.hops[1:] for q in e["queries"]]
        expected = {}
        # the hits the loop got for each later query (a query repeated at a later hop is searched again,
        # deeper): a seen chunk a search missed scores its lowest hit
        for hits in (h for query, h in rec.calls if query in later):
            floor = min(h.score for h in hits)
            for c in b.chunks:
                got = next((h.score for h in hits if h.id == c.id), floor)
                expected[c.id] = max(expected.get(c.id, float("-inf")), got)
        assert b.extra["requery_scores"] == pytest.approx(expected)
        if later:  # a dominant weight ranks by the later queries' scores
            scores = [expected[c.id] for c in b.chunks]
            assert scores == sorted(scores, reverse=True)
            moved += [c.id for c in a.chunks] != [c.id for c in b.chunks]
        else:
            assert [c.id for c in a.chunks] == [c.id for c in b.chunks]
    assert moved and any(r.hops[1:] for r in heavy)
    with pytest.raises(ValueError, match="requery_weight needs pool_order"):
        EfficientRAGConfig(requery_weight=1.0)
    assert "requery_weight" not in EfficientRAGConfig(pool_order="fused").to_json()  # old configs still match


def test_relabel_weight_ranks_by_the_labelers_p_under_the_later_queries(models, retriever, questions):
    # pool_order fused (p itself): the tiny model's p are far below fused_logit's clamp, so log-odds would tie
    kw = dict(max_hops=3, tag_threshold=0.0, token_threshold=0.0, pool_source="seen", pool_order="fused",
              retrieval_weight=0.5)
    plain = make_loop(models, retriever, **kw).run(questions)
    heavy = make_loop(models, retriever, relabel_weight=1e15, **kw).run(questions)
    lab, _ = load(models, None, None, None)
    moved = 0
    for a, b in zip(plain, heavy):
        # the loop itself is unchanged: same hops, tags, kept words and queries, same chunks in the pool
        assert a.hops == b.hops and sorted(c.id for c in a.chunks) == sorted(c.id for c in b.chunks)
        later = [q for e in b.hops[1:] for q in e["queries"]]
        if not later:  # stopped at hop 0: nothing was reread and the order stays
            assert "relabel_scores" not in b.extra or not b.extra["relabel_scores"]
            assert [c.id for c in a.chunks] == [c.id for c in b.chunks]
            continue
        # expected: the best p(<Continue>) of each chunk under every query of a hop after the chunk's own
        expected = {}
        for c in b.chunks:
            qs = [q for e in b.hops[c.hop + 1:] for q in e["queries"]] + ([c.query] if c.hop else [])
            ps = lab.predict(qs, [words(chunk_text(c.title, c.text, "title_text"))] * len(qs))
            expected[c.id] = max(p for p, _ in ps)
        assert b.extra["relabel_scores"] == pytest.approx(expected, abs=1e-4)
        scores = [b.extra["relabel_scores"][c.id] for c in b.chunks]
        assert scores == sorted(scores, reverse=True)  # a dominant weight ranks by the reread p
        moved += [c.id for c in a.chunks] != [c.id for c in b.chunks]
    assert moved
    with pytest.raises(ValueError, match="relabel_weight needs pool_order"):
        EfficientRAGConfig(relabel_weight=1.0)
    assert "relabel_weight" not in EfficientRAGConfig(pool_order="fused").to_json()  # old configs still match


def test_batched_equals_one_at_a_time(models, retriever, questions):
    probe = make_loop(models, retriever, max_hops=1, tag_threshold=0.0, token_threshold=0.0).run(questions)
    tag_t = split_point([c.score for r in probe for c in r.chunks])
    lab, _ = load(models)
    word_p = [p for _, probs in lab.predict(questions[:2], [c.kept_words for c in probe[0].chunks[:2]]) for p in probs]
    loop = make_loop(models, retriever, max_hops=3, query_mode="per_chunk", max_branches=3,
                     tag_threshold=tag_t, token_threshold=split_point(word_p))
    batch = loop.run(questions)
    assert sum(len(r.chunks) for r in batch) > 0 and any(r.iterations > 1 for r in batch)
    assert any(len(labeled_ids(r)) > len(r.chunks) for r in batch), "want a mix of continue and terminate"
    for q, b in zip(questions, batch):
        s = loop.run([q])[0]
        assert [c.id for c in s.chunks] == [c.id for c in b.chunks]
        assert [c.kept_words for c in s.chunks] == [c.kept_words for c in b.chunks]
        assert [c.score for c in s.chunks] == pytest.approx([c.score for c in b.chunks], abs=1e-5)
        assert [e["queries"] for e in s.hops] == [e["queries"] for e in b.hops]


def test_inputs_match_the_synthesised_training_data():
    """Synthesis and the loop build model inputs with the very same functions (one definition, in effrag.text)."""
    import effrag.text as text
    from data_synthesis import annotation, llm_steps
    from effrag.data.records import Passage

    assert llm_steps.filter_input_words is text.filter_input_words is annotation.filter_input_words
    assert llm_steps.passage_text is text.passage_text and llm_steps.INFO is text.INFO
    p = Passage.make("Dimond Center", "The Dimond Center is a shopping mall in Anchorage, Alaska.")
    assert text.passage_text(p) == chunk_text(p.title, p.text) == "Dimond Center: " + p.text
    assert chunk_text("", p.text) == chunk_text(p.title, p.text, "text") == p.text
    kept = [["KGOT", "in", "the", "Dimond", "Center"], ["Anchorage"]]
    q = "How large is the mall?"
    assert filter_input_words(q, kept) == words(q) + ["Info", ":"] + kept[0] + ["Info", ":"] + kept[1]


def test_config_validation_and_files(tmp_path):
    with pytest.raises(ValueError, match="query_mode"):
        EfficientRAGConfig(query_mode="both")
    with pytest.raises(ValueError, match="hop_k"):
        EfficientRAGConfig(hop_k=0)
    with pytest.raises(ValueError, match="unknown EfficientRAGConfig option.*tag_treshold"):
        EfficientRAGConfig.from_dict({"tag_treshold": 0.3})
    f = tmp_path / "best.json"
    f.write_text(json.dumps({"config": {"tag_threshold": 0.3, "hop_k": 5}, "metrics": {"recall": 0.8}}))
    cfg = build_config(str(f), hop_k=7, max_hops=None)
    assert (cfg.tag_threshold, cfg.hop_k, cfg.max_hops) == (0.3, 7, 4)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        build_config(str(tmp_path / "bad.json"))


def test_rejects_bad_inputs(models, retriever):
    lab, fil = load(models)
    with pytest.raises(TypeError, match="search"):
        EfficientRAGLoop(lab, fil, object())
    with pytest.raises(ValueError, match="question 1"):
        EfficientRAGLoop(lab, fil, retriever).run(["ok?", "  "])


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

    lab, fil = load(models, tag=20.0)
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
