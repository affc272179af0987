"""IRRR: dynamic oracle, training data, input layout, heads and losses, save/load, the loop's stopping rule.

Models are tiny ELECTRAs built from a config (tests/test_models.py); the BM25 engine is the
real one over the bundled sample or a hand-made corpus.
"""
from __future__ import annotations

import itertools
import json

import pytest
import torch

from data_synthesis.irrr_oracle import make_rank_fn, oracle_query, overlapping_spans, path_segments
from data_synthesis.irrr_steps import build_irrr_data
from effrag.data import Corpus, Passage, build_corpus, load_questions, sample_path
from effrag.training.tasks.irrr import StepCollator, check_irrr_record, featurize_irrr, irrr_metrics, irrr_stats, STAT_NAMES
from effrag.models import IRRRModel, load_model
from effrag.models.irrr import NOANSWER, SPAN, YES, answerability
from effrag.models.spans import best_spans
from effrag.models.irrr_encoding import CONT_TOKEN, encode_path, find_answer
from effrag.models.tokenization import IGNORE
from effrag.pipelines.irrr import IRRRConfig, IRRRPipeline, IRRRRunner, outcome
from effrag.pretrained import NAMES, NotShippedError
from effrag.retrieval.bm25 import BM25Retriever
from effrag.text import words

from test_models import make_base

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
    return StepCollator(model.tokenizer.pad_token_id)(featurize_irrr(model, recs, model.max_length))


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


# -- the loop -------------------------------------------------------------------------------------
def _rigged(electra, answer_type: int) -> IRRRModel:
    """A model whose reader always prefers ``answer_type`` (head weights zeroed, bias set)."""
    model = IRRRModel.from_encoder(electra, {"max_length": 128}).eval()
    with torch.no_grad():
        model.type_head.weight.zero_()
        model.type_head.bias.fill_(0.0)
        model.type_head.bias[answer_type] = 10.0
    return model


def test_loop_stops_when_answerable_and_at_path_cap(electra, sample_corpus):
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    qs = [q.question for q in load_questions(sample_path("hotpotqa", "dev"), limit=3)]

    never = IRRRRunner(_rigged(electra, NOANSWER), bm25, IRRRConfig(k=3, max_path=3, answer_threshold=0.0))
    for r in never.run(qs):
        assert r["steps"][-1]["stop"] == "path cap" and r["iterations"] == 3
        assert len({*r["retrieved"]}) == len(r["retrieved"]) and len(r["retrieved"]) >= 3
        assert r["paragraphs_read"] == sum(len(s["candidates"]) for s in r["steps"]) <= 9
        path = [s["appended"] for s in r["steps"]]
        assert len(set(path)) == 3 and set(path) <= set(r["retrieved"])  # reranker's picks, never repeated
        assert all(s["query"] for s in r["steps"])

    now = IRRRRunner(_rigged(electra, YES), bm25, IRRRConfig(k=3, max_path=3, answer_threshold=0.0))
    res = now.run(qs)
    for r in res:
        assert r["iterations"] == 1 and r["steps"][0]["stop"] == "answerable" and r["answer"] == "yes"
        assert len(r["retrieved"]) == 1  # the paragraph it answered from
    # questions in a batch move in lockstep; results equal one-at-a-time runs
    assert [now.run([q])[0]["retrieved"] for q in qs] == [r["retrieved"] for r in res]

    # a threshold nothing reaches: runs to the cap and returns the best answer read
    high = IRRRRunner(_rigged(electra, YES), bm25, IRRRConfig(k=2, max_path=2, answer_threshold=1e9))
    r = high.run(qs[:1])[0]
    assert r["iterations"] == 2 and r["steps"][-1]["stop"] == "path cap" and r["answer"] == "yes"


def test_first_k_reads_deeper_and_return_k_fills_by_reranker(electra, sample_corpus):
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    qs = [q.question for q in load_questions(sample_path("hotpotqa", "dev"), limit=2)]
    cfg = IRRRConfig(k=2, first_k=4, max_path=2, answer_threshold=1e9, return_k=5)
    for r in IRRRRunner(_rigged(electra, NOANSWER), bm25, cfg).run(qs):
        first, second = r["steps"]
        assert len(first["candidates"]) == 4 and len(second["candidates"]) == 2
        rank = {}
        for st in r["steps"]:
            for cid, score in zip(st["candidates"], st["rerank"]):
                rank[cid] = max(score, rank.get(cid, float("-inf")))
        # a paragraph read again at step 2 (with the longer path) counts once
        n = min(5, len(rank))
        assert len(r["retrieved"]) == n and len(set(r["retrieved"])) == n and set(r["retrieved"]) <= set(rank)
        paper = outcome(r["steps"])["retrieved"]  # the path and the answer's paragraph come first
        assert {first["appended"], second["appended"]} <= set(paper) and r["retrieved"][:len(paper)] == paper
        fill = r["retrieved"][len(paper):]
        assert [rank[c] for c in fill] == sorted((rank[c] for c in fill), reverse=True)
        left_out = set(rank) - set(r["retrieved"])
        assert fill and all(rank[c] <= min(rank[f] for f in fill) for c in left_out)
    # without return_k the paper's output: the path and the answer's paragraph only
    plain = IRRRRunner(_rigged(electra, NOANSWER), bm25, IRRRConfig(k=2, first_k=4, max_path=2, answer_threshold=1e9))
    assert all(len(r["retrieved"]) <= 3 for r in plain.run(qs))
    with pytest.raises(ValueError, match="return_k"):
        IRRRConfig(return_k=0)


def test_outcome_cuts_and_fills_from_the_trace():
    steps = [{"candidates": ["a", "b", "c"], "rerank": [0.1, 2.0, -1.0], "appended": "b",
              "best": {"id": "a", "answer": "x", "answerability": -3.0}},
             {"candidates": ["d", "a"], "rerank": [0.5, 3.0],
              "best": {"id": "d", "answer": "y", "answerability": 1.0}, "stop": "answerable"}]
    assert outcome(steps)["retrieved"] == ["b", "d"]
    assert outcome(steps, return_k=4) == {"retrieved": ["b", "d", "a", "c"], "answer": "y", "answerability": 1.0}
    assert outcome(steps, return_k=1)["retrieved"] == ["b"]
    # retrieval order: step 1's candidates in the retriever's order before step 2's, whatever the reranker says
    steps[1]["candidates"], steps[1]["rerank"] = ["e", "a"], [9.0, 3.0]
    assert outcome(steps, return_k=4, fill_order="retrieval")["retrieved"] == ["b", "d", "a", "c"]
    assert outcome(steps, return_k=4, fill_order="rerank")["retrieved"] == ["b", "d", "e", "a"]
    with pytest.raises(ValueError, match="fill_order"):
        outcome(steps, return_k=4, fill_order="best")
    with pytest.raises(ValueError, match="fill_order"):
        IRRRConfig(fill_order="best")


def test_reader_answers_other_methods_chunks(electra, sample_corpus):
    """IRRRReader (a Direct-R / EfficientRAG generator) reads each chunk alone and keeps the most answerable."""
    from effrag.models.irrr import IRRRReader

    model = _rigged(electra, YES).train()
    hits = BM25Retriever(sample_corpus, show_progress=False).search(["Who directed the film?"], 3)[0]
    encs = [model.encode("Who directed the film?", [{"title": h.title, "text": h.text}]) for h in hits]
    scores = model.predict(encs, batch_size=2)
    assert model.training  # predict runs in eval mode and restores the caller's mode
    reads = [model.read(e, s) for e, s in zip(encs, scores)]
    assert [r["rank"] for r in reads] == [s.rank for s in scores] and {r["answer"] for r in reads} == {"yes"}
    out = IRRRReader(model)("Who directed the film?", hits)
    best = max(range(len(reads)), key=lambda i: reads[i]["answerability"])
    assert out["answer"] == "yes" and out["llm_calls"] == 0 and out["trace"]["chunk"] == hits[best].id
    assert IRRRReader(model)("Who directed the film?", []) == {"answer": "", "llm_calls": 0}


def test_pipeline_output_and_options(electra, sample_corpus, tmp_path):
    model = _rigged(electra, NOANSWER)
    model.save_pretrained(tmp_path / "m")
    bm25 = BM25Retriever(sample_corpus, show_progress=False)
    p = IRRRPipeline(bm25, irrr_model=str(tmp_path / "m"), k=2, irrr_max_path=2)
    assert p.config.k == 2 and p.config.max_path == 2
    out = p.run("Who directed the film?").to_row()  # as predictions.jsonl records it
    assert set(out) >= {"retrieved", "scores", "answer", "iterations", "trace", "paragraphs_read", "timing"}
    assert out["llm_calls"] == 0 and len(out["scores"]) == len(out["retrieved"])
    with pytest.raises(ValueError, match="unknown IRRR option"):
        IRRRPipeline(bm25, irrr_model=model, bogus=1)
    if "irrr-all" not in NAMES:  # the default is the shipped irrr-all: until it ships, one line with the command
        with pytest.raises(NotShippedError, match="irrr-all .*not shipped.*train_models.py --models irrr"):
            IRRRPipeline(bm25)
    # a generator (effrag eval --reader / --llm) answers IRRR's paragraphs; IRRR's own answer stays beside it
    seen = []

    def generator(question, chunks):
        seen.append([c.id for c in chunks])
        return {"answer": "from the generator", "llm_calls": 0, "trace": {"reader": "test"}}

    read = IRRRPipeline(bm25, irrr_model=model, k=2, irrr_max_path=2, generator=generator).run("Who directed the film?")
    row = read.to_row()
    assert row["answer"] == "from the generator" and row["irrr_answer"] == out["answer"]
    assert seen == [row["retrieved"]] and row["generation"] == {"reader": "test"} and row["llm_calls"] == 0


def test_cli_irrr_data_and_eval(electra, tmp_path, capsys):
    from effrag.cli import main

    hp_train, hp_dev = str(sample_path("hotpotqa", "train")), str(sample_path("hotpotqa", "dev"))
    assert main(["irrr-data", "--inputs", hp_train, "--limit", "3", "--output", str(tmp_path / "d"), "--quiet"]) == 0
    recs = [json.loads(line) for line in (tmp_path / "d" / "irrr.jsonl").read_text().splitlines()]
    assert {r["qid"] for r in recs} == {q.id for q in load_questions(hp_train, limit=3)}
    assert json.loads((tmp_path / "d" / "build_config.json").read_text())["candidates"] == 5
    assert main(["irrr-data", "--inputs", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "x")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err

    _rigged(electra, NOANSWER).save_pretrained(tmp_path / "m")
    assert main(["eval", "--method", "irrr", "--irrr-model", str(tmp_path / "m"), "--irrr-max-path", "2",
                 "--questions", hp_dev, "--corpus-from", hp_train, "--retriever", "bm25", "--k", "3",
                 "--limit", "2", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "e")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["iterations"] == 2 and r["paragraphs_read"] <= 6 for r in rows)
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())[0]
    assert m["method"] == "irrr" and 0 <= m["recall"] <= 1 and "f1" in m and "em" in m
    # --irrr-first-k reads deeper at step 1, --irrr-return-k returns a Direct-R-sized pool
    assert main(["eval", "--method", "irrr", "--irrr-model", str(tmp_path / "m"), "--irrr-max-path", "2",
                 "--irrr-first-k", "5", "--irrr-return-k", "6", "--irrr-fill-order", "retrieval",
                 "--questions", hp_dev, "--corpus-from", hp_train,
                 "--retriever", "bm25", "--k", "3", "--limit", "2", "--cache-dir", str(tmp_path / "cache"),
                 "--output", str(tmp_path / "f")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "f" / "predictions.jsonl").read_text().splitlines()]
    for r in rows:
        read = {c for step in r["trace"]["hops"] for c in step["candidates"]}
        assert len(r["trace"]["hops"][0]["candidates"]) == 5 and len(r["retrieved"]) == min(6, len(read)) > 3
        paper = outcome(r["trace"]["hops"])["retrieved"]  # the path and the answer's paragraph, then the fill
        assert r["retrieved"][:len(paper)] == paper
        fill = r["retrieved"][len(paper):]
        order = [c for st in r["trace"]["hops"] for c in st["candidates"]]  # retrieval order: step 1's candidates first
        assert fill == sorted(fill, key=order.index)


def test_bm25_article_option_is_appendix_b_score(tmp_path):
    """Paragraph BM25 + article score with IDF+^2 and b = 0; kept through save/load."""
    import math

    from effrag.retrieval import load_retriever

    ps = [Passage.make("Zorbland", "Zorbland is a country with rivers."), Passage.make("Zorbland", "Its capital is Quix."),
          *[Passage.make(f"Other {i}", f"Town {i} has a market.") for i in range(4)]]
    corpus = Corpus(ps)
    plain, art = BM25Retriever(corpus, show_progress=False), BM25Retriever(corpus, article=True, show_progress=False)
    # "zorbland" occurs twice in the Zorbland article (title + text); 5 articles, df 1; k1 = 1.2
    idf = math.log((5 - 1 + 0.5) / (1 + 0.5))
    extra = idf ** 2 * 2 * 2.2 / (2 + 1.2)
    s_plain, s_art = plain.scores("zorbland"), art.scores("zorbland")
    assert s_art[1] - s_plain[1] == pytest.approx(extra, rel=1e-4)  # "Its capital is Quix." gains via its article
    assert s_art[0] - s_plain[0] == pytest.approx(extra, rel=1e-4)
    assert s_art[2] == s_plain[2] == 0
    assert [h.id for h in art.search(["zorbland capital"], 2)[0]] == [ps[1].id, ps[0].id]
    art.save(tmp_path / "idx")
    loaded = load_retriever(tmp_path / "idx")
    assert loaded.opts["article"] is True and list(loaded.scores("zorbland")) == pytest.approx(list(s_art))


def test_tune_irrr_replays_thresholds_and_return_k(electra, tmp_path, load_script):
    """scripts/tune_irrr.py: one run to the cap per (query threshold, first_k), stops and fills replayed from it."""

    from effrag.data import sample_path as sp

    tune = load_script("tune_irrr")
    _rigged(electra, NOANSWER).save_pretrained(tmp_path / "m")
    out = tmp_path / "t"
    args = ["--irrr", str(tmp_path / "m"), "--data", str(sp("hotpotqa", "dev").parents[1]), "--datasets", "hotpotqa",
            "--limit", "2", "--query-thresholds", "0.3", "--first-k", "4", "--k", "2", "--max-path", "2",
            "--answer-thresholds", "-100", "100", "--return-k", "5", "--fill-order", "rerank", "retrieval",
            "--objective", "recall", "--output", str(out)]
    assert tune.main(args) == 0
    grid = json.loads((out / "grid.json").read_text())["grid"]
    assert len(grid) == 4 and {e["fill_order"] for e in grid} == {"rerank", "retrieval"}
    never, first = (next(e for e in grid if e["answer_threshold"] == t and e["fill_order"] == "rerank")
                    for t in (100, -100))
    # stopped at step 1 nothing is left to order: both fills return the same
    first_retrieval = next(e for e in grid if e["answer_threshold"] == -100 and e["fill_order"] == "retrieval")
    assert first_retrieval["hotpotqa"] == first["hotpotqa"]
    # stops at once: the 4 read at step 1 are all returned (fewer than return_k)
    assert first["hotpotqa"]["steps"] == 1 and first["hotpotqa"]["read"] == first["hotpotqa"]["returned"] == 4
    runs = [json.loads(line) for line in (out / "runs_q0.3_fk4_k2_hotpotqa.jsonl").read_text().splitlines()]
    distinct = [len({c for st in r["steps"] for c in st["candidates"]}) for r in runs]  # step 2 may re-read one
    assert never["hotpotqa"]["steps"] == 2 and never["hotpotqa"]["read"] == 6
    assert never["hotpotqa"]["returned"] == sum(min(5, n) for n in distinct) / 2
    assert never["recall"] >= first["recall"]
    best = json.loads((out / "best.json").read_text())
    top = max(e["recall"] for e in grid)
    chosen = min((e for e in grid if round(e["recall"], 6) == round(top, 6)), key=lambda e: e["read"])
    assert best["answer_threshold"] == chosen["answer_threshold"] and best["return_k"] == 5
    assert {k: best[k] for k in ("query_threshold", "max_path", "k", "first_k")} == {
        "query_threshold": 0.3, "max_path": 2, "k": 2, "first_k": 4}
    assert best.get("fill_order", "rerank") in ("rerank", "retrieval")
    assert "hotpotqa recall" in (out / "table.md").read_text()
    assert tune.main(args) == 0  # resumes: nothing rerun, same grid
    assert json.loads((out / "grid.json").read_text())["grid"] == grid


def test_bench_qa_irrr_config_file_configures_the_loop(electra, sample_corpus, tmp_path, load_script):
    """scripts/bench_qa.py --irrr-config: a tuner's best.json sets IRRR's loop; bad files are one-line errors."""

    bench = load_script("bench_qa")
    assert bench.load_irrr_config(None) == {}
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"query_threshold": 0.15, "answer_threshold": -2.0, "max_path": 2, "k": 2,
                                "first_k": 4, "return_k": 5, "fill_order": "retrieval"}))
    config = bench.load_irrr_config(best)
    p = IRRRPipeline(BM25Retriever(sample_corpus, show_progress=False), irrr_model=_rigged(electra, NOANSWER),
                     config=config)
    assert (p.config.first_k, p.config.return_k, p.config.fill_order, p.config.answer_threshold) == (
        4, 5, "retrieval", -2.0)
    assert len(p.run("Who directed the film?").chunks) <= 5
    for text, why in (("[1, 2]", "expected a JSON object"), ("{oops", "cannot read a JSON object")):
        best.write_text(text)
        with pytest.raises(SystemExit, match=f"--irrr-config {best}: {why}"):
            bench.load_irrr_config(best)
    best.write_text(json.dumps({"bogus": 1}))
    with pytest.raises(ValueError, match="unknown IRRR option"):
        IRRRPipeline(BM25Retriever(sample_corpus, show_progress=False), irrr_model=_rigged(electra, NOANSWER),
                     config=bench.load_irrr_config(best))
