"""The set-wise pool ranker (issue #70): its features read the set, its scores depend on the other candidates,
padding and order change nothing, and its files round-trip or are refused."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from effrag.models import set_ranker as sr  # noqa: E402
from effrag.pipelines.efficientrag import EfficientRAGConfig  # noqa: E402
from effrag.pipelines.efficientrag.pool import pool_candidates  # noqa: E402
from effrag.pipelines.result import Chunk  # noqa: E402


def _record(cid, title, text, ranker, hop=0, rejected=False, linked=None):
    return {"id": cid, "title": title, "text": text, "hop": hop, "rejected": rejected, "labeler": 0.0,
            "ranker": ranker, "retrieval_rank": 0, "requery_rank": None, "plain": ranker,
            "linked": ranker if linked is None else linked}


RECORDS = [_record("a", "Film X", "Film X was directed by Jane Doe in 1990.", 5.0),
           _record("b", "Jane Doe (director)", "Jane Doe is an American director.", 1.0, hop=1),
           _record("c", "Other Film", "Another film, unrelated.", 2.0, rejected=True)]


def test_features_read_links_titles_and_flags():
    feats, links = sr.candidate_features("Who directed Film X?", ["Jane Doe birth"], RECORDS)
    col = {n: i for i, n in enumerate(sr.FEATURE_NAMES)}
    assert len(feats) == 3 and all(len(f) == len(sr.FEATURE_NAMES) for f in feats)
    assert links == [[0, 0, 0], [1, 0, 0], [0, 0, 0]]  # a's text names b's title; nothing names a or c
    assert feats[1][col["named_by_top"]] == 1.0 and feats[2][col["named_by_top"]] == 0.0
    assert feats[0][col["log_names"]] > 0 and feats[1][col["log_names"]] == 0
    assert feats[0][col["title_in_question"]] == 1.0 and feats[1][col["title_in_question"]] == 0.0
    assert feats[1][col["title_in_queries"]] == 1.0
    assert feats[0][col["plain_rel"]] == 0.0 and feats[1][col["plain_rel"]] == pytest.approx(-0.8)
    assert feats[2][col["rejected"]] == 1.0 and feats[1][col["hop1"]] == 1.0
    assert sr.candidate_features("q", [], []) == ([], [])


def _batch(records, question="Who directed Film X?"):
    feats, links = sr.candidate_features(question, [], records)
    return sr.collate([(feats, links, [0] * len(records))], 8)


def test_scores_depend_on_the_other_candidates_only_when_set_wise():
    torch.manual_seed(0)
    for set_wise in (True, False):
        model = sr.build_model(set_wise=set_wise, dropout=0.0).eval()
        x, links, pad, _ = _batch(RECORDS)
        base = model(x, links, pad)[0, :3]
        x2 = x.clone()
        x2[0, 2] += 1.0  # change the third candidate only
        moved = model(x2, links, pad)[0, :3]
        assert torch.allclose(base[:2], moved[:2]) != set_wise


def test_order_and_padding_change_nothing():
    torch.manual_seed(0)
    model = sr.build_model(dropout=0.0).eval()
    x, links, pad, _ = _batch(RECORDS)
    s = model(x, links, pad)[0]
    assert torch.isinf(s[3:]).all() and torch.isfinite(s[:3]).all()
    perm = [2, 0, 1]
    xp, lp = x[:, perm + list(range(3, 8))], links[:, perm + list(range(3, 8))][:, :, perm + list(range(3, 8))]
    sp = model(xp, lp, pad)[0, :3]
    assert torch.allclose(sp, s[perm], atol=1e-5)
    x16, l16, p16, _ = sr.collate([(x[0, :3].tolist(), links[0, :3, :3].tolist(), [0, 0, 0])], 16)
    assert torch.allclose(model(x16, l16, p16)[0, :3], s[:3], atol=1e-5)


def test_the_loss_asks_every_gold_to_outrank_every_other():
    gold = torch.tensor([[True, False, True, False]])
    pad = torch.tensor([[False, False, False, True]])
    good = sr.set_loss(torch.tensor([[3.0, 0.0, 3.0, 0.0]]), gold, pad)
    bad = sr.set_loss(torch.tensor([[3.0, 0.0, -1.0, 0.0]]), gold, pad)
    assert good < bad
    # a padded slot never counts as a negative
    assert sr.set_loss(torch.tensor([[3.0, 0.0, 3.0, 99.0]]), gold, pad) == pytest.approx(float(good))


def test_a_set_wise_model_learns_what_a_pointwise_one_cannot():
    """The gold is whichever candidate the best-scored one names: a fact about the set, not about a chunk."""
    import random

    rng = random.Random(0)
    sets = []
    for _ in range(160):
        n = 6
        recs = [_record(f"c{i}", f"Title{i} Word", "plain text here", rng.uniform(0, 1)) for i in range(n)]
        top, target = rng.sample(range(n), 2)
        recs[top]["ranker"] = recs[top]["plain"] = recs[top]["linked"] = 5.0
        recs[top]["text"] = f"It names Title{target} Word."
        labels = [int(i == top or i == target) for i in range(n)]
        feats, links = sr.candidate_features("question", [], recs)
        for f in feats:  # leave the model only the scores and the link matrix
            f[sr.FEATURE_NAMES.index("named_by_top")] = f[sr.FEATURE_NAMES.index("log_named_by")] = 0.0
        sets.append((feats, links, labels))

    def accuracy(set_wise):
        torch.manual_seed(0)
        model = sr.build_model(set_wise=set_wise, dim=32, dropout=0.0)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(40):
            for b in range(0, 128, 32):
                x, links, pad, gold = sr.collate(sets[b: b + 32], 8)
                loss = sr.set_loss(model(x, links, pad), gold, pad)
                opt.zero_grad()
                loss.backward()
                opt.step()
        x, links, pad, gold = sr.collate(sets[128:], 8)
        with torch.no_grad():
            top2 = model(x, links, pad).topk(2).indices
        return float(gold.gather(1, top2).float().mean())

    assert accuracy(True) > 0.9 > 0.75 > accuracy(False)


def test_files_round_trip_and_a_foreign_file_is_refused(tmp_path):
    torch.manual_seed(0)
    model = sr.build_model(dim=16, layers=1).eval()
    sr.save(model, tmp_path / "m", {"seed": 0})
    back = sr.load(tmp_path / "m")
    x, links, pad, _ = _batch(RECORDS)
    assert torch.allclose(model(x, links, pad), back(x, links, pad), atol=1e-2)  # stored in fp16
    assert torch.equal(back(x, links, pad), sr.load(tmp_path / "m")(x, links, pad))  # what runs is what is stored
    weights = tmp_path / "m" / "set_ranker.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-2] + bytes([good[-2] ^ 1]) + good[-1:])  # one bit of one weight
    with pytest.raises(ValueError, match="set_ranker.safetensors: SHA-256 differs"):
        sr.load(tmp_path / "m")
    weights.write_bytes(good)
    cfg = json.loads((tmp_path / "m" / "set_ranker.json").read_text())
    (tmp_path / "m" / "set_ranker.json").write_text(json.dumps({**cfg, "format": "other/9"}))
    with pytest.raises(ValueError, match="set_ranker.json: format 'other/9'"):
        sr.load(tmp_path / "m")
    (tmp_path / "m" / "set_ranker.json").write_text(json.dumps({**cfg, "features": ["x"] + cfg["features"][1:]}))
    with pytest.raises(ValueError, match="features differ"):
        sr.load(tmp_path / "m")


def test_the_pool_writes_the_records_in_its_order_with_and_without_links():
    def chunk(cid, title, text, logit):
        return Chunk(id=cid, title=title, text=text, score=0.5, hop=0, retrieval_rank=0, rank_score=logit)

    chunks = [chunk("a", "Film X", "Film X was directed by Jane Doe in 1990.", 5.0),
              chunk("c", "Other Film", "Another film, unrelated.", 2.0),
              chunk("b", "Jane Doe (director)", "Jane Doe is an American director.", 1.5)]
    state = SimpleNamespace(question="q", pool=chunks, rejected=[], rescores={}, requeries=[],
                            timing={}, trace=[], iterations=1, link_forms={})
    cfg = EfficientRAGConfig(pool_order="rank", pool_source="seen", retrieval_weight=0.0, link_weight=1.0,
                             link_top=1, max_candidates=1)
    recs = pool_candidates(state, cfg, top=2)
    assert [r["id"] for r in recs] == ["a", "b"]  # the order with links, past max_candidates, cut at top
    assert recs[1]["linked"] == pytest.approx(2.5) and recs[1]["plain"] == pytest.approx(1.5)
    assert recs[0]["ranker"] == 5.0 and recs[0]["rejected"] is False


def test_a_system_with_set_ranker_reorders_its_pool_head_and_one_without_is_refused(tiny_efficientrag_dirs, tmp_path,
                                                                                     capsys):
    """``effrag eval --model DIR`` with a config that sets ``set_ranker_top``: the system's ``set-ranker/`` reorders
    the pool's first N (the rest stays in the rank order), exactly as the model scores the pool's records; without
    the folder it is one line."""
    import shutil

    from helpers import run_cli

    from effrag.data import sample_path
    from effrag.pipelines.efficientrag.pool import pool_candidates

    dev = sample_path("hotpotqa", "dev")
    system = tmp_path / "sys"
    for name in ("labeler", "filter", "ranker"):
        shutil.copytree(tiny_efficientrag_dirs[name], system / name)
    loop = {"hop_k": 4, "first_hop_k": 10, "max_hops": 2, "pool_order": "rank", "pool_source": "seen", "link_weight": 2.0,
            "max_candidates": 8}
    (system / "loop.json").write_text(json.dumps({"config": {**loop, "set_ranker_top": 6}, "retriever": "bm25"}))

    def run(out):
        return run_cli(["eval", "--method", "efficientrag", "--model", system, "--questions", dev, "--corpus-from",
                        dev, "--limit", "3", "--cache-dir", tmp_path / "idx", "--output", tmp_path / out], capsys)

    code, _, err = run("none")
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and len(lines) == 1 and "set_ranker_top needs a set-wise pool ranker" in lines[0], err
    torch.manual_seed(3)
    model = sr.build_model(dim=16, layers=1).eval()
    sr.save(model, system / "set-ranker")
    code, _, err = run("set")
    assert code == 0, err
    got = [json.loads(x)["retrieved"] for x in (tmp_path / "set" / "predictions.jsonl").read_text()
           .splitlines()]

    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline
    from effrag.setup import RunSetup

    run_setup = RunSetup.build(dev, corpus_from=[dev], retriever="bm25", limit=3, cache=False)
    pipe = EfficientRAGPipeline(run_setup.retriever, model=system, config=EfficientRAGConfig(**loop))
    states = pipe.loop.run_states(run_setup.texts)
    for s, ids in zip(states, got):
        recs = pool_candidates(s, pipe.loop.config, 6)
        scores = model.predict(s.question, [q for e in s.trace for q in e.get("next_queries", [])], recs)
        head = [recs[i]["id"] for i in sorted(range(len(recs)), key=lambda i: -scores[i])]
        plain_order = [c.id for c in pipe.loop.rank_pools([s])[0].chunks]
        assert ids == (head + plain_order[len(recs):])[:8]
    assert any(ids[:6] != [c.id for c in pipe.loop.rank_pools([s])[0].chunks][:6] for s, ids in zip(states, got))


def _rows(dump, gains, n=50):
    """Evidence rows: the pool finds half the gold at every cut; order ``m@10`` adds ``gains[i % len(gains)]``."""
    return [{"id": f"q{i}", "dump": dump, "curves": {"pool": [0.5] * 10,
                                                     "m@10": [0.5 + gains[i % len(gains)]] * 10}} for i in range(n)]


def test_the_rule_ships_the_model_where_folds_agree_and_keeps_the_pool_where_they_do_not():
    from effrag.tuning.set_ranker import apply_decision, evaluate_unit, group_rows

    groups = group_rows(_rows("a-dev-own", [0.1]) + _rows("b-dev-own", [0.5, -0.5, 0.02]), exclude=["q0"])
    assert len(groups["a-dev-own"]) == 49
    d = evaluate_unit(groups, ["a-dev-own"])
    assert d["fold_picks"] == ["m@10"] * 5 and (d["ships"], d["top"]) == ("m@10", 10)
    assert d["crossfit"]["a-dev-own"][7] == pytest.approx(0.6)
    # in-sample the model wins by a hair (the mean gain is > 0), but each fold's pick is noise: cross-fitted worse
    noisy = evaluate_unit(group_rows(_rows("c-dev-own", [0.9, -0.9, 0.9, -0.9, 0.02], n=20)), ["c-dev-own"])
    assert noisy["pick"] == "m@10" and noisy["ships"] == "pool" and noisy["top"] == 0
    loop = {"config": {"hop_k": 5, "set_ranker_top": 20}, "retriever": "hybrid"}
    shipped = apply_decision(loop, d, "reports/x.md")
    assert shipped["config"] == {"hop_k": 5, "set_ranker_top": 10} and shipped["set_ranker"]["report"] == "reports/x.md"
    kept = apply_decision(loop, noisy, "reports/x.md")
    assert kept["config"] == {"hop_k": 5} and kept["set_ranker"]["top"] == 0 and loop["config"]["set_ranker_top"] == 20


def test_an_ensemble_scores_its_members_mean_and_checks_each_member(tmp_path):
    torch.manual_seed(0)
    members = [sr.build_model(dim=16, layers=1).eval() for _ in range(3)]
    sr.save_ensemble(members, tmp_path / "e", {"epochs": 1})
    back = sr.load(tmp_path / "e")
    x, links, pad, _ = _batch(RECORDS)
    singles = [sr.load(tmp_path / "e" / f"member{i}")(x, links, pad)[0, :3] for i in range(3)]
    assert torch.allclose(back(x, links, pad)[0, :3], torch.stack(singles).mean(0), atol=1e-6)
    assert back.predict("Who directed Film X?", [], RECORDS) == pytest.approx(back(x, links, pad)[0, :3].tolist())
    w = tmp_path / "e" / "member1" / "set_ranker.safetensors"
    w.write_bytes(w.read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="member1/set_ranker.safetensors: SHA-256 differs"):
        sr.load(tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "set_ranker.json").read_text())
    (tmp_path / "e" / "set_ranker.json").write_text(json.dumps({**cfg, "members": ["../elsewhere"]}))
    with pytest.raises(ValueError, match="'members' must name member folders inside"):
        sr.load(tmp_path / "e")


def test_a_unit_with_no_questions_is_one_error_naming_it():
    """A run whose dev questions are all the bundled sample's (which choose nothing) leaves a unit empty: one line
    naming it, not an IndexError (scripts/set_ranker.py report then says --keep-sample lets them choose)."""
    from effrag.tuning.set_ranker import evaluate_unit

    with pytest.raises(ValueError, match="no questions to decide on for musique-dev-own"):
        evaluate_unit({}, ["musique-dev-own"])
    with pytest.raises(ValueError, match="an empty unit"):
        evaluate_unit({}, [])
