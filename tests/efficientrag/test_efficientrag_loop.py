"""EfficientRAG inference: the loop (the pipeline, the public API and answer generation: test_efficientrag_api.py).

The Labeler and Filter are real (tiny, randomly initialised BERT encoders with the
all-MiniLM-L6-v2 tokenizer, saved and loaded through their checkpoint format);
where a test needs a fixed decision it sets a head's weights to zero and its bias
to a large value, which makes the real model always continue / keep / drop.
Retrieval is real BM25 over a slice of the bundled HotpotQA sample.
"""
from __future__ import annotations

import json
import math

import pytest
from helpers import fixed_heads

from effrag.pipelines.efficientrag import CONTINUE, TERMINATE, EfficientRAGConfig, EfficientRAGLoop, build_config
from effrag.text import chunk_text, filter_input_words, join_words, words

# the fixtures (hotpot, retriever, questions, model_dirs, models): tests/efficientrag/conftest.py
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def make_loop(models, retriever, tag=None, token=None, filt=None, **cfg):
    lab, fil = fixed_heads(models, tag, token, filt)
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
    lab, fil = fixed_heads(models, None, None, None)
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


def test_batched_equals_one_at_a_time(models, retriever, questions):
    probe = make_loop(models, retriever, max_hops=1, tag_threshold=0.0, token_threshold=0.0).run(questions)
    tag_t = split_point([c.score for r in probe for c in r.chunks])
    lab, _ = fixed_heads(models)
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
    lab, fil = fixed_heads(models)
    with pytest.raises(TypeError, match="search"):
        EfficientRAGLoop(lab, fil, object())
    with pytest.raises(ValueError, match="question 1"):
        EfficientRAGLoop(lab, fil, retriever).run(["ok?", "  "])
