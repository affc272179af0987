"""IRRR: dynamic oracle, training data, input layout, heads and losses, save/load (the loop, the pipeline and
its tuning: test_irrr_loop.py).

Models are tiny ELECTRAs built from a config (tests/helpers.py); the BM25 engine is the
real one over the bundled sample or a hand-made corpus.
"""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from helpers import make_base

from data_synthesis.irrr_oracle import make_rank_fn, oracle_query, overlapping_spans, path_segments
from data_synthesis.irrr_steps import build_irrr_data
from effrag.data import Corpus, Passage, build_corpus, load_questions, sample_path
from effrag.models import IRRRModel, load_model
from effrag.models.irrr import NOANSWER, SPAN, YES, answerability
from effrag.models.irrr_encoding import CONT_TOKEN, encode_path, find_answer
from effrag.models.spans import best_spans
from effrag.models.tokenization import IGNORE
from effrag.retrieval.bm25 import BM25Retriever
from effrag.text import words
from effrag.training.tasks.base import group_collator
from effrag.training.tasks.irrr import SEQ_KEYS, STAT_NAMES, check_irrr_record, featurize_irrr, irrr_metrics, irrr_stats

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def electra(tmp_path_factory) -> str:
    return make_base("electra", tmp_path_factory.mktemp("irrr") / "electra")


@pytest.fixture(scope="module")
def sample_steps(tmp_path_factory):
    """IRRR training steps for 6 HotpotQA + 6 MuSiQue bundled train questions, real BM25 ranks."""
    files = [sample_path("hotpotqa", "train"), sample_path("musique", "train")]
    qs = [q for f in files for q in load_questions(f, limit=6)]
    corpus = build_corpus(files)
    out = tmp_path_factory.mktemp("steps")
    stats = build_irrr_data(qs, corpus, BM25Retriever(corpus, show_progress=False), out, progress=False)
    recs = [json.loads(line) for line in (out / "irrr.jsonl").read_text().splitlines()]
    return {"records": recs, "stats": stats, "questions": qs, "corpus": corpus, "dir": out, "files": files}


# -- oracle ---------------------------------------------------------------------------------------
def test_oracle_importance_order_and_greedy_stop_with_known_ranks():
    """Rank table where 'alpha beta' alone is best, 'gamma' helps only together, 'delta' hurts."""
    segs = [words("Which alpha beta river runs to gamma town past delta ?")]
    target = words("The alpha beta river runs to gamma town and then delta")
    table = {frozenset(): 100, frozenset({"alpha beta river runs to gamma town"}): 1}

    # overlapping spans are maximal runs: here the question shares one long run and 'delta' with the target
    spans = [s.text for s in overlapping_spans(segs, target)]
    assert spans == ["alpha beta river runs to gamma town", "delta"]

    def rank(_t, query):
        key = frozenset(s for s in spans if s in query)
        return {frozenset(spans): 3, frozenset({"delta"}): 50}.get(key, table.get(key, 100))

    o = oracle_query(segs, "t", target, rank)
    # Imp(run) = rank({delta}) - rank({run}) = 49 > Imp(delta) = rank({run}) - rank({delta}) = -49:
    # the run goes in first (rank 1); adding delta makes it 3, so the oracle stops.
    assert o.spans == ["alpha beta river runs to gamma town"] and o.rank == 1 and o.n_candidates == 2
    labelled = [w for w, lab in zip(segs[0], o.labels[0]) if lab]
    assert labelled == "alpha beta river runs to gamma town".split()


def test_oracle_spans_are_whole_and_skip_stopword_only_runs():
    segs = path_segments("What is the name of David Dunn 's toad ?", [{"title": "Toads", "text": "David Dunn wrote of the toad."}])
    spans = overlapping_spans(segs, words("David Dunn kept a toad named Gollum; the toad is a species."))
    texts = [s.text for s in spans]
    assert "david dunn" in texts and "david" not in texts  # a shared run is taken whole
    assert "the" not in texts and "is" not in texts and "of" not in texts  # stopword-only runs are not terms
    dd = next(s for s in spans if s.text == "david dunn")
    assert [o[0] for o in dd.occurrences] == [0, 2]  # found in the question and in the paragraph text


def test_oracle_on_real_bm25_matches_best_subset():
    """A target reachable only by combining two spans: the oracle finds the brute-force best query."""
    passages = [Passage.make("Kestrel Bridge", "Kestrel Bridge crosses the Orla river near Vennick."),
                *[Passage.make(f"Kestrel {i}", f"Kestrel Bridge, the Kestrel Bridge of team {i} in Kestrel county.") for i in range(6)],
                *[Passage.make(f"Orla {i}", f"The Orla river floods village {i} every spring, Orla river locals say.") for i in range(6)],
                *[Passage.make(f"Filler {i}", f"Unrelated paragraph number {i} about cooking pasta.") for i in range(8)]]
    corpus = Corpus(passages)
    bm25 = BM25Retriever(corpus, show_progress=False)
    rank = make_rank_fn(bm25, corpus.position)
    target = passages[0]
    segs = path_segments("Which Kestrel Bridge spans the Orla river?", [])
    o = oracle_query(segs, target.id, words(target.title) + words(target.text), rank)
    spans = [s.text for s in overlapping_spans(segs, words(target.title) + words(target.text))]
    best = min(rank(target.id, " ".join(c)) for n in range(1, len(spans) + 1) for c in itertools.combinations(spans, n))
    assert o.rank == best == 1
    assert all(rank(target.id, s) > 1 for s in spans)  # no single span suffices
    assert sorted(o.spans) == ["kestrel bridge", "the orla river"]


# -- data -----------------------------------------------------------------------------------------
def test_training_steps_are_valid_and_resume(sample_steps, tmp_path):
    recs, stats = sample_steps["records"], sample_steps["stats"]
    assert stats["questions"] == 12 and stats["steps"] == len(recs)
    for i, r in enumerate(recs):
        check_irrr_record(r, f"irrr.jsonl:{i + 1}")
        assert r["target"] not in {p["id"] for p in r["path"]}
        assert any(c["gold"] for c in r["candidates"])  # the target is always among the candidates
        assert 1 <= len(r["candidates"]) <= 5
    by_q = {}
    for r in recs:
        by_q.setdefault((r["dataset"], r["qid"]), []).append(r)
    for steps in by_q.values():
        # the final step reads the last gold paragraph: some candidate completes the path and is answerable
        assert any(c["answer_type"] != "noanswer" for c in steps[-1]["candidates"])
        for s, nxt in zip(steps, steps[1:]):
            if any(c["answer_type"] != "noanswer" for c in s["candidates"]):
                # only when the path was then extended with a distractor (a recovery step follows)
                assert nxt["recovery"] and nxt["path"][-1]["id"] in {c["id"] for c in s["candidates"] if not c["gold"]}
        assert [s["step"] for s in steps] == list(range(len(steps)))
    # rerun over more questions: finished ones are skipped, nothing is written twice
    qs = sample_steps["questions"] + load_questions(sample_steps["files"][0])[6:8]
    corpus = sample_steps["corpus"]
    again = build_irrr_data(qs, corpus, BM25Retriever(corpus, show_progress=False), sample_steps["dir"], progress=False)
    assert again["skipped_done"] == 12 and again["questions"] == 2
    keys = [(json.loads(line)["qid"], json.loads(line)["step"])
            for line in (sample_steps["dir"] / "irrr.jsonl").read_text().splitlines()]
    assert len(keys) == len(set(keys))
    st = json.loads((sample_steps["dir"] / "stats.json").read_text())
    assert st["steps"] == len(keys) and st["questions"] == 14 and 0 < st["oracle_rank_1"] <= st["oracle_top5"] <= 1


def test_bad_record_names_the_field():
    with pytest.raises(ValueError, match=r"f.jsonl:3: field 'query_labels' has 1 segments"):
        check_irrr_record({"question": "q", "answers": ["a"], "path": [{"title": "t", "text": "x"}],
                           "candidates": [], "query_labels": [[0]]}, "f.jsonl:3")


# -- input layout ---------------------------------------------------------------------------------
def test_path_layout_cont_token_labels_and_truncation(electra):
    model = IRRRModel.from_encoder(electra, {"max_length": 64})
    tok = model.tokenizer
    path = [{"title": "Gollum", "text": "Gollum is a character in a novel"},
            {"title": "Toad", "text": " ".join(["The toad species was named after him"] * 8)}]
    enc = encode_path(tok, "Which toad is named after Gollum ?", path, 64)
    ids = enc.input_ids
    cont, cls, sep = tok.convert_tokens_to_ids(CONT_TOKEN), tok.cls_token_id, tok.sep_token_id
    assert ids[0] == cls and ids[-1] == sep and ids.count(cont) == 2 and ids.count(sep) == 3
    assert len(ids) <= 64 and enc.truncated > 0
    assert all(p >= 0 for p in enc.first[2])  # the short first paragraph survives whole
    assert enc.first[4][0] >= 0  # the long last one is cut, not dropped
    labels = [[0] * len(s) for s in enc.segments]
    labels[0][-2] = 1  # "Gollum" in the question
    tl = enc.token_labels(labels)
    assert tl[enc.first[0][-2]] == 1 and sum(x == 1 for x in tl) == 1
    assert sum(x != IGNORE for x in tl) == sum(p >= 0 for f in enc.first for p in f)
    assert find_answer(enc.segments, "a character", prefer=[4]) == (2, 2, 3)


# -- heads and losses -----------------------------------------------------------------------------
def _batch(model, recs):
    return group_collator(SEQ_KEYS)(model.tokenizer.pad_token_id)(featurize_irrr(model, recs, model.max_length))


def test_heads_shapes_losses_and_training_signal(electra, sample_steps):
    torch.manual_seed(0)
    model = IRRRModel.from_encoder(electra, {"max_length": 128, "head_dropout": 0.0})
    assert CONT_TOKEN in model.tokenizer.get_vocab()
    assert model.encoder.get_input_embeddings().num_embeddings == len(model.tokenizer)
    recs = sample_steps["records"][:3]
    batch = _batch(model, recs)
    n_seq = sum(1 + len(r["candidates"]) for r in recs)
    out = model(**batch)
    T = batch["input_ids"].shape[1]
    assert out.token_logits.shape == (n_seq, T, 2) and out.type_logits.shape == (n_seq, 4)
    assert out.start_logits.shape == (n_seq, T) and out.rank_scores.shape == (n_seq,)
    for part in (out.query_loss, out.type_loss, out.span_loss, out.rerank_loss):
        assert torch.isfinite(part) and part > 0
    parts = [x.detach() for x in (out.loss, out.query_loss, out.type_loss, out.span_loss, out.rerank_loss)]
    assert float(parts[0]) == pytest.approx(float(sum(parts[1:])), rel=1e-5)
    # the reranker loss is -log(softmax mass on gold) averaged over steps
    manual = []
    for g in range(len(recs)):
        m = (batch["rank_group"] == g) & (batch["rank_label"] != IGNORE)
        logp = out.rank_scores[m].log_softmax(0)
        pos = batch["rank_label"][m] == 1
        if 0 < pos.sum() < m.sum():
            manual.append(-torch.logsumexp(logp[pos], 0))
    assert float(out.rerank_loss.detach()) == pytest.approx(float(torch.stack(manual).mean().detach()), rel=1e-5)
    # reader losses weigh answerable and unanswerable candidates equally (most candidates cannot answer)
    at = batch["answer_type"]
    ce = torch.nn.functional.cross_entropy(out.type_logits, at, ignore_index=IGNORE, reduction="none")
    ans, na = (at != IGNORE) & (at != NOANSWER), at == NOANSWER
    assert ans.any() and na.sum() > ans.sum()
    assert float(out.type_loss.detach()) == pytest.approx(float(((ce[ans].mean() + ce[na].mean()) / 2).detach()), rel=1e-5)
    # query sequences carry query labels only; candidates carry reader/reranker targets only
    q_rows = batch["rank_label"] == IGNORE
    assert int(q_rows.sum()) == len(recs) and (batch["answer_type"][q_rows] == IGNORE).all()
    assert (batch["labels"][~q_rows] == IGNORE).all()
    assert (batch["start_positions"][batch["answer_type"] == NOANSWER] == 0).all()
    # every head learns: a few steps on this batch cut the loss
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(25):
        loss = model(**batch).loss
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(model(**batch).loss.detach()) < 0.5 * first
    stats = irrr_stats(model(**batch), batch)
    assert stats.shape == (len(recs), len(STAT_NAMES))
    m = irrr_metrics(dict(zip(STAT_NAMES, stats.sum(0).tolist())))
    assert m["n"] == len(recs) and 0.0 <= m["score"] <= 1.0 and m["rerank_top1"] > 0


def test_answerability_is_appendix_c_likelihood_ratio():
    start = torch.tensor([[1.0, 0.0, 5.0, 0.0]])
    end = torch.tensor([[2.0, 0.0, 0.0, 6.0]])
    bs, be, _ = best_spans(start, end, torch.tensor([[False, True, True, True]]))
    assert (int(bs), int(be)) == (2, 3)
    span_logits = torch.tensor([[3.0, 0.0, 0.0, 1.0]])  # SPAN best, NOANSWER 1
    a, t = answerability(span_logits, start, end, bs, be)
    assert int(t) == SPAN and float(a) == pytest.approx((3 - 1) + (5 - 1) / 2 + (6 - 2) / 2)
    yes_logits = torch.tensor([[0.0, 4.0, 1.0, 2.5]])
    a, t = answerability(yes_logits, start, end, bs, be)
    assert int(t) == YES and float(a) == pytest.approx(1.5)  # yes/no: no span term


def test_save_load_round_trip(electra, sample_steps, tmp_path):
    model = IRRRModel.from_encoder(electra, {"max_length": 96}).eval()
    batch = _batch(model, sample_steps["records"][:2])
    with torch.inference_mode():
        a = model(**batch)
    model.save_pretrained(tmp_path / "irrr", training={"note": "test"})
    meta = json.loads((tmp_path / "irrr" / "effrag_config.json").read_text())
    assert meta["model_type"] == "irrr" and meta["label_names"]["answer_type"] == ["span", "yes", "no", "noanswer"]
    loaded = load_model(tmp_path / "irrr").eval()
    assert isinstance(loaded, IRRRModel) and CONT_TOKEN in loaded.tokenizer.get_vocab()
    with torch.inference_mode():
        b = loaded(**_batch(loaded, sample_steps["records"][:2]))
    for key in ("token_logits", "type_logits", "start_logits", "rank_scores"):
        assert torch.allclose(getattr(a, key), getattr(b, key), atol=1e-5), key
