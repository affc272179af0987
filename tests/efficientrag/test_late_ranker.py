"""The late-interaction pool ranker: MaxSim over separately encoded vectors, each chunk read once, its checkpoint,
its training task, and the loop reading with it. Real tiny models over real BM25 on the bundled HotpotQA sample."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import bm25_over, hotpot_dev, tiny_bert_base

from effrag.models import LateRankerModel, load_model
from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hotpot():
    return hotpot_dev(12)


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    base = tiny_bert_base(tmp_path_factory.mktemp("late_base"), seed=3)
    torch.manual_seed(3)
    model = LateRankerModel.from_encoder(str(base), {"dim": 16, "max_length": 48, "query_max_length": 16}).eval()
    with torch.no_grad():
        model.log_scale.fill_(0.5)
    return model


def _vectors(model, text, length):
    enc = model.tokenizer([text], truncation=True, max_length=length, return_tensors="pt")
    with torch.no_grad():
        return model.token_vectors(enc["input_ids"], enc["attention_mask"])[0]


def test_a_pair_scores_the_maxsim_of_the_query_and_chunk_encoded_apart(late, hotpot):
    q = hotpot[0]
    chunks = [p.text.split() for p in q.contexts[:5]]
    scores = late.predict([q.question] * 5, chunks, batch_size=2)
    assert len(set(scores)) == 5
    qv = _vectors(late, q.question, 16)
    for words, score in zip(chunks, scores):
        cv = _vectors(late, " ".join(words), 48)
        expected = (qv @ cv.T).max(1).values.sum() * math.exp(0.5)
        assert score == pytest.approx(float(expected), abs=1e-4)
    late._vectors.clear()
    assert late.predict([q.question], chunks[3:4]) == pytest.approx(scores[3:4], abs=1e-5)  # batch mates change nothing
    with pytest.raises(ValueError, match="2 queries for 1 chunks"):
        late.predict([q.question] * 2, chunks[:1])


def test_query_norm_scales_a_score_to_a_fixed_query_length(late, hotpot):
    """A sum over query tokens grows with the query; the loop ranks chunks read under different queries in one pool."""
    chunks = [p.text.split() for p in hotpot[2].contexts[:3]]
    queries = [" ".join(hotpot[2].question.split()[:3]), " ".join(hotpot[2].question.split()[:9])]
    plain = [late.predict([q] * 3, chunks) for q in queries]
    late.options["query_norm"] = 16
    try:
        normed = [late.predict([q] * 3, chunks) for q in queries]
    finally:
        late.options["query_norm"] = 0
    for q, a, b in zip(queries, plain, normed):
        n = len(late.tokenizer(q, truncation=True, max_length=16)["input_ids"])
        assert b == pytest.approx([x * 16 / n for x in a], rel=1e-5)
    assert normed[0] != normed[1]


def test_each_chunk_is_encoded_once_and_index_reads_them_ahead(late, hotpot):
    rows = []
    hook = late.encoder.register_forward_hook(lambda m, args, kw, out: rows.append(kw["input_ids"].shape[0]),
                                              with_kwargs=True)
    try:
        late._vectors.clear()
        chunks = [p.text.split() for q in hotpot[:3] for p in q.contexts[:4]]
        assert late.index(chunks, batch_size=5) == {"loaded": 0, "encoded": 12} and sum(rows) == 12
        assert len({tuple(c) for c in chunks}) == 12
        rows.clear()
        questions = [hotpot[0].question, hotpot[1].question]
        first = late.predict([questions[i % 2] for i in range(12)], chunks)
        assert sum(rows) == 2  # only the two queries: every chunk came from the index
        rows.clear()
        assert late.predict([questions[i % 2] for i in range(12)], chunks) == first and sum(rows) == 2
        late._vectors.clear()
        rows.clear()
        assert late.predict([questions[i % 2] for i in range(12)], chunks) == pytest.approx(first, abs=1e-5)
        assert sum(rows) == 2 + 12  # unindexed: each chunk is encoded on its first read, once
    finally:
        hook.remove()


def test_a_read_at_another_length_or_precision_never_gets_vectors_made_for_another(late, hotpot):
    """The cache keys a chunk by its words and the length and dtype its vectors were made at: a request that reads
    at 8 sub-tokens, or in bf16, scores as a cold model would, whatever was read before."""
    late._vectors.clear()
    q, chunks = hotpot[1].question, [p.text.split() for p in hotpot[1].contexts[:3]]
    full = late.predict([q] * 3, chunks)
    short = late.predict([q] * 3, chunks, max_length=8)
    brain = late.predict([q] * 3, chunks, bf16=True)
    from effrag.hardware import resolve_bf16

    # a CPU without fast bf16 reads bf16=True in fp32 (effrag.hardware): the same vectors, one key
    assert len(late._vectors) == (9 if resolve_bf16(True, "cpu") else 6) and short != full
    late._vectors.clear()
    assert late.predict([q] * 3, chunks, max_length=8) == short
    late._vectors.clear()
    assert late.predict([q] * 3, chunks, bf16=True) == brain
    late._vectors.clear()


def test_the_cache_keeps_at_most_cache_chunks(late, hotpot):
    late._vectors.clear()
    limit = late.options["cache_chunks"]
    late.options["cache_chunks"] = 3
    try:
        chunks = [p.text.split() for p in hotpot[0].contexts[:6]]
        scores = late.predict([hotpot[0].question] * 6, chunks)
        assert len(late._vectors) == 3 and [k[-1] for k in late._vectors] == [tuple(c) for c in chunks[3:]]  # the newest kept
        late.predict([hotpot[0].question], chunks[3:4])  # read again: now the most recently read
        late.predict([hotpot[0].question], chunks[0:1])  # a new chunk drops the least recently read (chunks[4])
        assert [k[-1] for k in late._vectors] == [tuple(c) for c in (chunks[5], chunks[3], chunks[0])]
        late._vectors.clear()
        assert late.predict([hotpot[0].question] * 6, chunks) == pytest.approx(scores, abs=1e-5)
    finally:
        late.options["cache_chunks"] = limit
        late._vectors.clear()


def test_a_saved_late_ranker_loads_by_type_and_the_loop_reads_with_it(late, hotpot, tiny_efficientrag_dirs, tmp_path):
    from effrag.pipelines.efficientrag.models import load_models

    late.save_pretrained(tmp_path / "late", compact=True)
    meta = json.loads((tmp_path / "late" / "effrag_config.json").read_text())
    assert meta["model_type"] == "late_ranker" and meta["options"]["dim"] == 16
    again = load_model(tmp_path / "late")
    assert isinstance(again, LateRankerModel)
    chunks = [p.text.split() for p in hotpot[1].contexts[:4]]
    assert again.predict([hotpot[1].question] * 4, chunks) == pytest.approx(
        late.predict([hotpot[1].question] * 4, chunks), abs=0.05)  # int8 rows: close, not equal
    d = tiny_efficientrag_dirs
    lab, fil, rank = load_models(d["labeler"], d["filter"], "cpu", ranker=tmp_path / "late")
    assert isinstance(rank, LateRankerModel)
    with pytest.raises(ValueError, match="not a pool ranker"):
        load_models(d["labeler"], d["filter"], "cpu", ranker=d["filter"])
    retriever = bm25_over(hotpot)
    config = EfficientRAGConfig(hop_k=4, first_hop_k=8, max_hops=2, tag_threshold=0.0, pool_source="seen",
                                pool_order="rank", labeler_top=2, rescore_top=4)
    questions = [q.question for q in hotpot[:4]]
    cold = EfficientRAGLoop(lab, fil, retriever, config, ranker=rank).run(questions)
    assert all(c.rank_score is not None for r in cold for c in r.chunks)
    rank._vectors.clear()
    loop = EfficientRAGLoop(lab, fil, retriever, config, ranker=rank)
    prepared = loop.prepare()
    assert prepared["passages"] == len(retriever.corpus) == len(rank._vectors)  # the whole corpus read at index time
    warm = loop.run(questions)
    for a, b in zip(cold, warm):
        assert [c.id for c in a.chunks] == [c.id for c in b.chunks]
        assert [c.rank_score for c in a.chunks] == pytest.approx([c.rank_score for c in b.chunks], abs=1e-4)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_late_ranker_trains_with_train_py_on_the_rankers_groups(tmp_path):
    from helpers import make_ranker_groups

    from effrag.training import load_config, train

    make_ranker_groups(tmp_path, 20)
    data = str(tmp_path / "groups" / "ranker.jsonl")
    base = tiny_bert_base(tmp_path / "base")
    cfg = load_config("late_ranker", {
        "model": {"name_or_path": str(base), "max_length": 64, "freeze": ["embeddings.word_embeddings"],
                  "extra_options": {"dim": 16, "distill_weight": 0.0}},
        "data": {"train_file": data, "eval_files": [data], "max_eval_examples": None},
        "train": {"output_dir": str(tmp_path / "run"), "epochs": 3, "lr": 3e-3, "mixed_precision": "no",
                  "save_every": 0, "log_every": 1}})
    res = train(cfg)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [x["train/loss"] for x in log if "train/loss" in x]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert res["eval"]["mrr"] > 0.6 and res["eval"]["n"] > 20  # the training groups, seen 3 times
    model = load_model(tmp_path / "run" / "last")
    assert isinstance(model, LateRankerModel) and model.options["dim"] == 16
    # distilling needs the teacher's scores on the training groups: one clear error, before any step
    cfg.model.extra_options["distill_weight"] = 0.5
    cfg.train.output_dir = str(tmp_path / "distill")
    with pytest.raises(ValueError, match="ranker-teacher"):
        train(cfg)


def test_a_late_read_is_costed_as_a_maxsim_not_a_forward(late, tmp_path, tiny_efficientrag_dirs):
    """The shipping rule orders configs by what they read: a late ranker's read is LATE_RANKER_READ of a Labeler read
    (its chunks were encoded at index time), a cross-encoder's its layers and length against the Labeler's."""
    from effrag.tuning.loop_cost import LATE_RANKER_READ, ranker_read_factor, read_cost

    late.save_pretrained(tmp_path / "ranker-late")
    d = tiny_efficientrag_dirs
    assert ranker_read_factor(tmp_path / "ranker-late", d["labeler"]) == LATE_RANKER_READ < 0.05
    assert ranker_read_factor(d["ranker"], d["labeler"]) > 10 * LATE_RANKER_READ
    assert read_cost({}, [4, 30, 1], LATE_RANKER_READ) == pytest.approx(4 + 30 / 60 + 0.25)


def test_export_system_ships_a_late_ranker_as_int8_rows(late, tmp_path, tiny_efficientrag_dirs):
    """scripts/export_pretrained.py: every ranker-<name>/ of a system goes out as int8 rows of its own type."""
    import shutil

    from effrag.models.compact import COMPACT_NAME
    from effrag.pretrained import LOOP_DATASETS
    from effrag.training.export import export_system

    src = tmp_path / "system"
    for role in ("labeler", "filter", "ranker"):
        shutil.copytree(tiny_efficientrag_dirs[role], src / role)
    late.save_pretrained(src / "ranker-late")
    for name in ("loop.json", *(f"loop-{d}.json" for d in LOOP_DATASETS)):
        (src / name).write_text(json.dumps({"config": {"max_hops": 2}, "ranker": "ranker-late"}))
    info = export_system(src, tmp_path / "shipped")
    assert (tmp_path / "shipped" / "ranker-late" / COMPACT_NAME).is_file() and info["int8_bytes"]["ranker-late"] > 0
    shipped = load_model(tmp_path / "shipped" / "ranker-late")
    assert isinstance(shipped, LateRankerModel) and shipped.options["dim"] == 16
