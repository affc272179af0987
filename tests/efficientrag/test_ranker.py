"""The pool ranker: its model, its training groups and task, and its place in EfficientRAG's loop.

Real tiny models (tests/conftest.py ``tiny_efficientrag_dirs``) and real BM25 over the bundled HotpotQA sample.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import bm25_over, hotpot_dev

from effrag.data import load_questions, sample_path
from effrag.models import FilterModel, LabelerModel, RankerModel, load_model
from effrag.models.ranker import listwise_loss
from effrag.models.tokenization import IGNORE
from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hotpot():
    return hotpot_dev(30)


@pytest.fixture(scope="module")
def retriever(hotpot):
    return bm25_over(hotpot)


@pytest.fixture(scope="module")
def models(tiny_efficientrag_dirs):
    d = tiny_efficientrag_dirs
    return (LabelerModel.from_pretrained(d["labeler"]).eval(), FilterModel.from_pretrained(d["filter"]).eval(),
            RankerModel.from_pretrained(d["ranker"]).eval())


class Counting:
    """A real model whose ``predict`` calls are counted (pairs read)."""

    def __init__(self, model):
        self.model, self.pairs = model, 0

    def predict(self, *args, **kw):
        self.pairs += len(args[0])
        return self.model.predict(*args, **kw)


# ---------------------------------------------------------------------- the model
def test_listwise_loss_is_minus_log_softmax_mass_on_gold():
    scores = torch.tensor([2.0, 0.0, 0.0, 1.0, 1.0, 5.0, 9.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    label = torch.tensor([1, 0, 0, 1, 1, 0, IGNORE])  # group 1 is all gold, group 2 has no gold: both skipped
    expected = -torch.log_softmax(torch.tensor([2.0, 0.0, 0.0]), 0)[0]
    assert listwise_loss(scores, group, label).item() == pytest.approx(expected.item())
    two_gold = listwise_loss(torch.tensor([1.0, 1.0, 1.0]), torch.zeros(3, dtype=torch.long), torch.tensor([1, 1, 0]))
    assert two_gold.item() == pytest.approx(-math.log(2 / 3))


def test_ranker_saves_loads_and_scores_pairs(tiny_efficientrag_dirs, models, hotpot, tmp_path):
    ranker = models[2]
    q = hotpot[0]
    chunks = [p.text.split() for p in q.contexts[:4]]
    scores = ranker.predict([q.question] * 4, chunks, batch_size=3)
    assert len(scores) == 4 and len(set(scores)) == 4
    assert ranker.predict([q.question], chunks[:1])[0] == pytest.approx(scores[0], abs=1e-4)  # batch-independent
    again = load_model(tiny_efficientrag_dirs["ranker"])
    assert isinstance(again, RankerModel) and again.predict([q.question] * 4, chunks) == pytest.approx(scores, abs=1e-5)
    with pytest.raises(ValueError, match="2 queries for 1 chunks"):
        ranker.predict([q.question] * 2, chunks[:1])


# ---------------------------------------------------------------------- the loop
def _loop(models, retriever, ranker=True, **cfg):
    lab, fil, rank = models
    counted = {"labeler": Counting(lab), "ranker": Counting(rank) if ranker else None}
    config = EfficientRAGConfig(**{"hop_k": 4, "first_hop_k": 8, "max_hops": 2, "tag_threshold": 0.0,
                                   "pool_source": "seen", "pool_order": "rank", "retrieval_weight": 1.0, **cfg})
    return EfficientRAGLoop(counted["labeler"], fil, retriever, config, ranker=counted["ranker"]), counted


def _relevance(c, weight):
    return c.rank_score - weight * math.log1p(c.retrieval_rank)


def test_rank_order_is_ranker_logit_minus_weighted_log_rank(models, retriever, hotpot):
    qs = [q.question for q in hotpot[:4]]
    for weight in (0.0, 3.0):
        loop, _ = _loop(models, retriever, retrieval_weight=weight)
        for r in loop.run(qs):
            assert len(r.chunks) >= 8 and all(c.rank_score is not None and c.retrieval_rank is not None for c in r)
            keys = [_relevance(c, weight) for c in r.chunks]
            assert keys == sorted(keys, reverse=True)
            logged = {c["id"]: c["rank_score"] for e in r.hops for c in e["chunks"]}
            assert all(logged[c.id] == pytest.approx(c.rank_score, abs=1e-4) for c in r)
    hop0 = [c for c in loop.run(qs[:1])[0].chunks if c.hop == 0]
    assert sorted(c.retrieval_rank for c in hop0) == list(range(8))  # the question's hits, in rank order


def test_without_a_ranker_rank_order_uses_the_labelers_log_odds(models, retriever, hotpot):
    loop, _ = _loop(models, retriever, ranker=False)
    r = loop.run([hotpot[0].question])[0]
    assert all(c.rank_score is None for c in r)
    p = [min(max(c.score, 1e-6), 1 - 1e-6) for c in r.chunks]  # the loop's log-odds are clamped there
    keys = [math.log(x / (1 - x)) - math.log1p(c.retrieval_rank) for x, c in zip(p, r.chunks)]
    assert keys == pytest.approx(sorted(keys, reverse=True))


def test_labeler_top_reads_only_the_best_ranked_new_chunks(models, retriever, hotpot):
    qs = [q.question for q in hotpot[:3]]
    full, n_full = _loop(models, retriever)
    top, n_top = _loop(models, retriever, labeler_top=2)
    res_full, res_top = full.run(qs), top.run(qs)
    assert n_top["ranker"].pairs == n_full["ranker"].pairs  # the ranker still reads every new chunk
    hops = sum(len(r.hops) for r in res_top)
    assert n_top["labeler"].pairs == 2 * hops < n_full["labeler"].pairs
    for r in res_top:
        for e in r.hops:
            read = [c for c in e["chunks"] if c["p_continue"] is not None]
            unread = [c for c in e["chunks"] if c["p_continue"] is None]
            assert len(read) == 2 and all(c["tag"] is None and c["kept"] == "" for c in unread)
            assert min(c["rank_score"] for c in read) >= max((c["rank_score"] for c in unread), default=-1e9)
    # hop 0 is the same retrieval and the same ranker scores in both runs
    assert [c["id"] for c in res_top[0].hops[0]["chunks"]] == [c["id"] for c in res_full[0].hops[0]["chunks"]]


def test_rescore_top_reads_seen_chunks_again_under_later_queries(models, retriever, hotpot):
    qs = [q.question for q in hotpot[:4]]
    plain, n_plain = _loop(models, retriever, labeler_top=2)
    again, n_again = _loop(models, retriever, labeler_top=2, rescore_top=6)
    res_plain, res_again = plain.run(qs), again.run(qs)
    rescored = [c for r in res_again for e in r.hops[1:] for c in e.get("rescored", [])]
    assert rescored and n_again["ranker"].pairs == n_plain["ranker"].pairs + len(rescored)
    assert not any("rescored" in e for r in res_again for e in r.hops[:1])  # hop 0 has nothing seen before
    for r in res_again:
        best = {}
        for e in r.hops[1:]:
            for c in e.get("rescored", []):
                best[c["id"]] = max(c["rank_score"], best.get(c["id"], -1e9))
        keys = [max(c.rank_score, best.get(c.id, -1e9)) - math.log1p(c.retrieval_rank) for c in r.chunks]
        assert keys == pytest.approx(sorted(keys, reverse=True), abs=1e-3)
    # reading again changes the order only: the same chunks are seen
    assert [sorted(r.ids) for r in res_again] == [sorted(r.ids) for r in res_plain]


def test_labeler_top_needs_a_ranker_and_results_do_not_depend_on_batch_mates(models, retriever, hotpot):
    loop, _ = _loop(models, retriever, ranker=False, labeler_top=2)
    with pytest.raises(ValueError, match="needs a pool ranker"):
        loop.run(["q"])
    loop, _ = _loop(models, retriever, labeler_top=3)
    qs = [q.question for q in hotpot[:4]]
    together = loop.run(qs)
    alone = [loop.run([q])[0] for q in qs]
    for a, b in zip(together, alone):
        assert a.ids == b.ids
        assert [c.rank_score for c in a] == pytest.approx([c.rank_score for c in b], abs=1e-4)


@pytest.mark.parametrize("extra", [{}, {"labeler_top": 2, "rescore_top": 3, "requery_weight": 1.0, "link_weight": 3.0,
                                       "backlink_weight": 3.0, "rank_query": "info", "max_candidates": 6}])
def test_label_last_hop_false_skips_the_last_hops_labeler_and_keeps_every_result(models, retriever, hotpot, extra):
    qs = [q.question for q in hotpot[:4]]
    full, n_full = _loop(models, retriever, max_hops=3, **extra)
    lean, n_lean = _loop(models, retriever, max_hops=3, label_last_hop=False, **extra)
    res_full, res_lean = full.run(qs), lean.run(qs)
    # the same chunks in the same order, with the same ranker scores: the last hop's tags order nothing
    assert [r.ids for r in res_lean] == [r.ids for r in res_full]
    assert [[c.rank_score for c in r] for r in res_lean] == [[c.rank_score for c in r] for r in res_full]
    assert n_lean["ranker"].pairs == n_full["ranker"].pairs
    last = [r.hops[-1] for r in res_lean if len(r.hops) == 3]
    assert last, "no question reached the last hop"
    skipped = sum(c["p_continue"] is not None for e in (r.hops[-1] for r in res_full if len(r.hops) == 3)
                  for c in e["chunks"])
    assert skipped and n_lean["labeler"].pairs == n_full["labeler"].pairs - skipped
    for e in last:
        assert e["chunks"] and all(c["p_continue"] is None and c["tag"] is None and c["kept"] == "" for c in e["chunks"])
        assert e["stop"] == "max_hops" and e["next_queries"] == []
    for a, b in zip(res_full, res_lean):  # the hops before the last are read as before
        assert b.hops[:2] == a.hops[:2]


def test_label_last_hop_false_needs_a_ranker_and_the_rank_order_over_every_seen_chunk(models, retriever):
    loop, _ = _loop(models, retriever, ranker=False, label_last_hop=False)
    with pytest.raises(ValueError, match="label_last_hop false needs a pool ranker"):
        loop.run(["q"])
    for bad in ({"pool_order": "fused"}, {"pool_source": "continue"}):
        with pytest.raises(ValueError, match="needs pool_order rank and pool_source seen"):
            EfficientRAGConfig(pool_order="rank", pool_source="seen", label_last_hop=False).replace(**bad)


def test_pipeline_and_eval_flags_take_a_ranker(tiny_efficientrag_dirs, retriever, hotpot, tmp_path):
    from effrag.pipelines import build_pipeline

    d = tiny_efficientrag_dirs
    pipe = build_pipeline("efficientrag", retriever, labeler=str(d["labeler"]), filter=str(d["filter"]),
                          ranker=str(d["ranker"]), pool_order="rank", pool_source="seen", labeler_top=2,
                          max_hops=2)
    r = pipe.run(hotpot[0].question)
    assert r.chunks and all(c.rank_score is not None for c in r)
    assert pipe.loop.config.labeler_top == 2


# ---------------------------------------------------------------------- training groups and the task
@pytest.fixture(scope="module")
def groups_dir(tmp_path_factory):
    """`effrag synthesize` (annotation, no negatives) then `effrag ranker-data` (BM25) on the HotpotQA train sample."""
    from helpers import make_ranker_groups

    root = tmp_path_factory.mktemp("ranker_data")
    return root, make_ranker_groups(root, 20)


def test_ranker_groups_hold_one_gold_against_non_gold_negatives(groups_dir):
    root, _ = groups_dir
    groups = [json.loads(x) for x in (root / "groups" / "ranker.jsonl").read_text().splitlines()]
    info = json.loads((root / "groups" / "ranker_data.json").read_text())
    questions = {q.id: q for q in load_questions(sample_path("hotpotqa", "train"))}
    positives = {(r["qid"], r["query"], r["chunk_id"]) for r in
                 map(json.loads, (root / "synth" / "labeler.jsonl").read_text().splitlines()) if r["tag"] == 1}
    assert info["groups"] == len(groups) > 20
    for g in groups:
        cands = g["candidates"]
        assert len(cands) == 4 and [c["gold"] for c in cands] == [1, 0, 0, 0]
        assert (g["qid"], g["query"], cands[0]["chunk_id"]) in positives
        q = questions[g["qid"]]
        gold_titles = {p.title for p in q.gold}
        assert not any(c["chunk_id"] in q.gold_ids or c["title"] in gold_titles for c in cands[1:])
        assert len({c["chunk_id"] for c in cands}) == 4
    # two groups per (query, gold), with disjoint negatives
    pairs: dict = {}
    for g in groups:
        pairs.setdefault((g["qid"], g["query"], g["candidates"][0]["chunk_id"]), []).append(
            {c["chunk_id"] for c in g["candidates"][1:]})
    assert max(len(v) for v in pairs.values()) == 2
    assert all(not (v[0] & v[1]) for v in pairs.values() if len(v) == 2)


def test_ranker_data_is_deterministic_and_a_finished_output_is_reused(groups_dir, capsys):
    from effrag.cli import main

    root, args = groups_dir
    before = (root / "groups" / "ranker.jsonl").read_bytes()
    assert main([a for a in args if a != "--quiet"]) == 0
    assert "reused" in capsys.readouterr().out
    other = [*args[:args.index("--output") + 1], str(root / "again"), *args[args.index("--output") + 2:]]
    assert main(other) == 0 and (root / "again" / "ranker.jsonl").read_bytes() == before


def test_ranker_trains_with_train_py_and_learns_the_groups(groups_dir, tmp_path):
    from helpers import tiny_bert_base
    from transformers import AutoModel

    from effrag.training import load_config, train

    root, _ = groups_dir
    base = tiny_bert_base(tmp_path / "base")
    data = str(root / "groups" / "ranker.jsonl")
    cfg = load_config("ranker", {"model": {"name_or_path": str(base), "max_length": 64,
                                           "freeze": ["embeddings.word_embeddings"]},
                                 "data": {"train_file": data, "eval_files": [data], "max_eval_examples": None},
                                 "train": {"output_dir": str(tmp_path / "run"), "epochs": 3, "lr": 3e-3,
                                           "mixed_precision": "no", "save_every": 0, "log_every": 1}})
    res = train(cfg)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [x["train/loss"] for x in log if "train/loss" in x]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 < math.log(4) + 0.2
    assert res["eval"]["mrr"] > 0.6 and res["eval"]["n"] > 20  # the training groups, seen 3 times
    model = load_model(tmp_path / "run" / "last")
    assert isinstance(model, RankerModel) and model.max_length == 64
    before = AutoModel.from_pretrained(base)  # frozen: the word embeddings are the base's, the rest trained
    assert torch.equal(model.encoder.embeddings.word_embeddings.weight, before.embeddings.word_embeddings.weight)
    assert not torch.equal(model.encoder.encoder.layer[0].attention.self.query.weight,
                           before.encoder.layer[0].attention.self.query.weight)
    from effrag.training.config import ConfigError

    with pytest.raises(ConfigError, match="model.freeze"):
        train(load_config("ranker", {"model": {"name_or_path": str(base), "freeze": ["no.such.weights"]},
                                     "data": {"train_file": data, "eval_files": []},
                                     "train": {"output_dir": str(tmp_path / "bad"), "mixed_precision": "no"}}))


def test_info_groups_repeat_a_next_querys_groups_under_its_filter_input(groups_dir):
    from effrag.cli import main
    from effrag.text import join_words

    root, args = groups_dir
    out = root / "info"
    assert main([*args[:args.index("--output") + 1], str(out), *args[args.index("--output") + 2:], "--info"]) == 0
    plain = [json.loads(x) for x in (root / "groups" / "ranker.jsonl").read_text().splitlines()]
    both = [json.loads(x) for x in (out / "ranker.jsonl").read_text().splitlines()]
    filters = [json.loads(x) for x in (root / "synth" / "filter.jsonl").read_text().splitlines()]
    info_of = {(f["qid"], f["target"]): join_words(f["words"]) for f in filters}
    info = [g for g in both if "Info:" in g["query"]]
    assert info and len(both) == len(plain) + len(info)
    assert json.loads((out / "ranker_data.json").read_text())["info_groups"] == len(info)
    by_query: dict = {}
    for g in plain:
        by_query.setdefault((g["qid"], g["query"]), []).append([c["chunk_id"] for c in g["candidates"]])
    for g in info:  # the same gold and negatives as one of the next query's own groups
        targets = [t for (qid, t), text in info_of.items() if qid == g["qid"] and text == g["query"]]
        assert [c["chunk_id"] for c in g["candidates"]] in by_query[(g["qid"], targets[0])]


# ---------------------------------------------------------------------- a system folder opened from one path
def _system(tiny_efficientrag_dirs, root, retriever="bm25"):
    import shutil

    for name in ("labeler", "filter", "ranker"):
        shutil.copytree(tiny_efficientrag_dirs[name], root / name)
    config = {"first_hop_k": 6, "hop_k": 3, "max_hops": 2, "tag_threshold": 0.3, "pool_source": "seen",
              "pool_order": "rank", "labeler_top": 2, "rescore_top": 3, "max_candidates": 5}
    (root / "loop.json").write_text(json.dumps({"config": config, "retriever": retriever}))
    (root / "loop-hotpotqa.json").write_text(json.dumps({"config": {**config, "max_candidates": 4},
                                                         "retriever": retriever}))
    return root


@pytest.mark.slow
def test_eval_opens_a_system_and_its_configs_retriever_unless_told_otherwise(tiny_efficientrag_dirs, tmp_path):
    from effrag.cli import main

    system = _system(tiny_efficientrag_dirs, tmp_path / "sys")
    dev = str(sample_path("hotpotqa", "dev"))
    base = ["eval", "--method", "efficientrag", "--model", str(system), "--questions", dev, "--limit", "3",
            "--corpus-from", dev, "--cache-dir", str(tmp_path / "idx")]
    assert main([*base, "--output", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())["run"]
    # HotpotQA questions: the system's loop-hotpotqa.json, and its retriever
    assert cfg["retriever"] == "bm25" and cfg["method_config"]["max_candidates"] == 4
    rows = [json.loads(x) for x in (tmp_path / "a" / "predictions.jsonl").read_text().splitlines()]
    assert all(len(r["retrieved"]) <= 4 for r in rows)
    assert all(c.get("rank_score") is not None for r in rows for h in r["trace"]["hops"] for c in h["chunks"])
    assert main([*base, "--retriever", "dense", "--output", str(tmp_path / "b")]) == 0  # told otherwise
    assert json.loads((tmp_path / "b" / "config.json").read_text())["run"]["retriever"] == "dense"
    assert main([*base, "--er-config", str(system / "loop.json"), "--output", str(tmp_path / "c")]) == 0
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())["run"]
    assert cfg["retriever"] == "bm25" and cfg["method_config"]["max_candidates"] == 5  # the general one, when named


def test_from_pretrained_opens_a_system_over_a_corpus(tiny_efficientrag_dirs, tmp_path, hotpot):
    from effrag import EfficientRAG
    from effrag.data import Corpus

    system = _system(tiny_efficientrag_dirs, tmp_path / "sys")
    corpus = Corpus.from_questions(hotpot)
    rag = EfficientRAG.from_pretrained(system, corpus=corpus)
    assert rag.retriever.kind == "bm25" and rag.config.max_candidates == 5 and rag.loop.ranker is not None
    r = rag.retrieve(hotpot[0].question)
    assert 0 < len(r) <= 5 and all(c.rank_score is not None for c in r)
    other = EfficientRAG.from_pretrained(system, corpus=corpus, retriever="bm25", dataset="hotpotqa")
    assert other.config.max_candidates == 4  # loop-hotpotqa.json, with the retriever named here
    with pytest.raises(ValueError, match="needs a retriever, or a corpus"):
        EfficientRAG.from_pretrained(system)


def test_ranker_max_length_cuts_only_the_rankers_input(models, retriever, hotpot):
    """ranker_max_length: every hop-0 rank_score is the ranker's logit of the pair cut at that many sub-tokens;
    the Labeler still reads its pairs whole (its kept words are unchanged)."""
    from effrag.text import chunk_text, words

    qs = [q.question for q in hotpot[:3]]
    whole, _ = _loop(models, retriever, labeler_top=2)
    cut, _ = _loop(models, retriever, labeler_top=2, ranker_max_length=24)
    res_whole, res_cut = whole.run(qs), cut.run(qs)
    lab, _, rank = models
    for r, q in zip(res_cut, qs):
        hop0 = r.hops[0]["chunks"]
        texts = [words(chunk_text(c["title"], retriever.corpus[c["id"]].text, "title_text")) for c in hop0]
        want = rank.predict([q] * len(hop0), texts, max_length=24)
        assert [c["rank_score"] for c in hop0] == pytest.approx([round(w, 4) for w in want], abs=2e-4)
        assert want != pytest.approx(rank.predict([q] * len(hop0), texts), abs=1e-3)  # the cut changed them
    kept = lambda res: {c["id"]: c["kept"] for r in res for c in r.hops[0]["chunks"] if c["p_continue"] is not None}  # noqa: E731
    shared = kept(res_cut).keys() & kept(res_whole).keys()
    assert shared and all(kept(res_cut)[i] == kept(res_whole)[i] for i in shared)
