"""Cross-fitting (effrag.tuning.crossfit): no question is scored by a config chosen on it."""
from __future__ import annotations

import json

import pytest

from effrag.tuning.crossfit import choose, config_key, crossfit, folds


def _row(name: str, gold_at: dict[str, list[int]], size: int = 10, cap=None, cost=(0, 0, 0)) -> dict:
    """A tuning row whose pool has each question's gold (2 per question) at the given 1-based positions."""
    return {"config": {"name": name, "max_candidates": cap},
            "per_question": [[q, 2, at, size, list(cost)] for q, at in gold_at.items()]}


IDS = [f"q{i}" for i in range(20)]


def test_folds_are_balanced_deterministic_and_independent_of_order():
    f = folds(IDS, 5)
    assert sorted(f) == sorted(IDS) and sorted(f.values()).count(0) == 4
    assert folds(list(reversed(IDS)), 5) == f
    assert folds(IDS, 5, seed=1) != f
    with pytest.raises(ValueError, match="at least 2 folds"):
        folds(IDS, 1)


def test_each_fold_is_scored_with_a_config_chosen_on_the_other_folds():
    fold = folds(IDS, 4)
    a = _row("a", {q: ([1, 2] if fold[q] != 3 else []) for q in IDS})  # perfect except on fold 3
    b = _row("b", {q: [1] for q in IDS})  # one gold of two everywhere
    res = crossfit({"d": [a, b]}, budgets=[7], k=4)
    assert {f["config"]["name"] for f in res["folds"]} == {"a"}  # a wins on every 3 folds out of 4
    assert res["datasets"]["d"]["recall"] == {7: pytest.approx(15 / 20)}  # fold 3 scores 0 held out
    assert all(f["chosen_on"]["d"] == 15 and f["scored_on"]["d"] == 5 for f in res["folds"])
    assert all(f["config"]["max_candidates"] == 7 for f in res["folds"])
    assert choose({"d": [a, b]}, budgets=[7])["config"]["name"] == "a"


def test_cross_fitting_exposes_a_choice_that_overfits():
    # each of 20 configs finds both gold of one question only; "steady" finds one gold of every question
    rows = [_row(f"c{i:02d}", {q: ([1, 2] if q == IDS[i] else []) for q in IDS}) for i in range(20)]
    rows.append(_row("steady", {q: [3] for q in IDS}))
    res = crossfit({"d": rows}, budgets=[7], k=5)
    assert res["datasets"]["d"]["recall"][7] == pytest.approx(0.5)
    assert {f["config"]["name"] for f in res["folds"]} == {"steady"}


def test_budgets_cut_every_question_and_the_held_out_curve():
    row = _row("a", {q: [1, 9] for q in IDS})
    d = crossfit({"d": [row]}, budgets=[7, 10], k=2)["datasets"]["d"]
    assert d["recall"] == {7: 0.5, 10: 1.0} and d["avg_chunks"] == {7: 7.0, 10: 10.0} and d["n"] == 20
    assert [r for _, r, _ in d["curve"]] == [0.5] * 8 + [1.0, 1.0]


def test_one_config_for_several_budgets_by_mean_recall():
    early = _row("early", {q: [1] for q in IDS})  # 0.5 at 7 and at 10
    late = _row("late", {q: [8, 9] for q in IDS})  # 0 at 7, 1 at 10
    assert choose({"d": [early, late]}, budgets=[7])["config"]["name"] == "early"
    assert choose({"d": [early, late]}, budgets=[10])["config"]["name"] == "late"
    assert choose({"d": [early, late]}, budgets=[7, 10])["config"]["name"] == "early"  # a tie: fewer chunks


def test_a_capped_run_config_keeps_its_cap():
    capped = _row("a", {q: [1, 2] for q in IDS}, size=5, cap=5)
    pick = choose({"d": [capped]}, budgets=[7, 10])
    assert pick["config"]["max_candidates"] == 5 and pick["in_sample"]["d"] == {7: 1.0, 10: 1.0}


def test_joint_choice_averages_datasets_and_excluded_questions_never_choose():
    ids2 = [f"r{i}" for i in range(10)]
    d1 = [_row("a", {q: [1, 2] for q in IDS}), _row("b", {q: [1] for q in IDS})]
    d2 = [_row("a", {q: [] for q in ids2}), _row("b", {q: [1, 2] for q in ids2})]
    assert choose({"d1": d1, "d2": d2}, budgets=[7])["config"]["name"] == "b"
    assert choose({"d1": d1}, budgets=[7])["config"]["name"] == "a"
    assert choose({"d1": d1}, budgets=[7], exclude=IDS[:10])["chosen_on"] == {"d1": 10}
    res = crossfit({"d1": d1, "d2": d2}, budgets=[7], k=2, exclude=IDS[:4])
    assert res["datasets"]["d1"]["n"] == 16 and res["datasets"]["d2"]["n"] == 10
    assert all(f["chosen_on"]["d1"] == 8 for f in res["folds"])


def test_held_out_reading_cost_is_the_chosen_configs():
    cheap = _row("cheap", {q: [1] for q in IDS}, cost=(3, 20, 1))
    dear = _row("dear", {q: [1, 2] for q in IDS}, cost=(30, 0, 2))
    res = crossfit({"d": [cheap, dear]}, budgets=[7], k=4)["datasets"]["d"]
    assert res["recall"][7] == 1.0 and res["forwards"] == [30, 0, 2]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="per_question"):
        crossfit({"d": [{"config": {"max_candidates": None}}]})
    with pytest.raises(ValueError, match="not among the scored caps"):
        crossfit({"d": [_row("a", {q: [1] for q in IDS})]}, budgets=[20])
    with pytest.raises(ValueError, match="no config is shared"):
        choose({"d1": [_row("a", {q: [1] for q in IDS})], "d2": [_row("b", {q: [1] for q in IDS})]})
    assert config_key({"a": 1, "max_candidates": 3}) == config_key({"max_candidates": None, "a": 1})


def test_the_cheapest_config_that_keeps_the_bar_on_the_choosing_questions_wins():
    """--rule cheapest: among the configs whose recall reaches the strongest baseline's on the same questions
    (+ margin), the one that reads least; the best recall when none does. Each fold's bar is its own questions'."""
    fold = folds(IDS, 4)
    cheap = _row("cheap", {q: [1] for q in IDS}, cost=(2, 5, 1))  # recall 0.5, 8.25 reads
    dear = _row("dear", {q: [1, 2] for q in IDS}, cost=(4, 50, 1))  # recall 1.0, 54.25 reads
    flaky = _row("flaky", {q: ([1] if fold[q] != 3 else []) for q in IDS}, cost=(1, 1, 0))  # 0 on fold 3
    base = {q: 0.5 for q in IDS}
    floors = {"d": {7: {"bm25": base, "dense": {q: 0.25 for q in IDS}}}}
    assert choose({"d": [cheap, dear]}, budgets=[7])["config"]["name"] == "dear"  # the best-recall rule
    assert choose({"d": [cheap, dear]}, budgets=[7], floors=floors)["config"]["name"] == "cheap"  # 0.5 >= 0.5
    assert choose({"d": [cheap, dear]}, budgets=[7], floors=floors, margin=0.01)["config"]["name"] == "dear"
    none = {"d": {7: {"bm25": {q: 1.0 for q in IDS}}}}  # no config keeps it: the best recall
    assert choose({"d": [cheap, dear]}, budgets=[7], floors=none)["config"]["name"] == "dear"
    # flaky is cheapest but misses the bar wherever fold 3 chooses: those folds take cheap, fold 3 takes flaky
    res = crossfit({"d": [cheap, dear, flaky]}, budgets=[7], k=4, floors=floors)
    by_fold = {f["fold"]: f["config"]["name"] for f in res["folds"]}
    assert by_fold == {0: "cheap", 1: "cheap", 2: "cheap", 3: "flaky"}
    assert res["datasets"]["d"]["recall"][7] == pytest.approx(15 * 0.5 / 20)  # held out, fold 3 scores 0: exposed
    with pytest.raises(ValueError, match="no baseline recall for question"):
        choose({"d": [cheap]}, budgets=[7], floors={"d": {7: {"bm25": {"q0": 1.0}}}})


def test_read_cost_weighs_each_read_by_its_input_length():
    from effrag.tuning.loop_cost import length_factor, read_cost

    assert read_cost({}, [4, 30, 2]) == pytest.approx(34.5)
    assert length_factor(None) == 1.0 and length_factor(512) == 1.0 and 0.6 < length_factor(128) < 0.75
    assert read_cost({"ranker_max_length": 128}, [4, 30, 0]) == pytest.approx(4 + 30 * length_factor(128))
    assert read_cost({"labeler_max_length": 96}, [4, 30, 0]) == pytest.approx(34 * length_factor(96))


def test_a_ranker_read_costs_its_layers_against_the_labelers(tmp_path, caplog):
    """A 2-layer ranker beside a 6-layer Labeler: a third of a read; the cheapest rule then prefers reading more with
    it over reading more with the Labeler."""
    from effrag.tuning.loop_cost import ranker_read_factor, read_cost

    for name, layers, length in (("ranker", 2, 256), ("labeler", 6, 256), ("short", 2, 128)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
        (tmp_path / name / "effrag_config.json").write_text(json.dumps({"max_length": length}))
    factor = ranker_read_factor(tmp_path / "ranker", tmp_path / "labeler")
    assert factor == pytest.approx(1 / 3)
    assert ranker_read_factor(tmp_path / "short", tmp_path / "labeler") == pytest.approx(128 / 188 / 3)  # own length
    assert ranker_read_factor(tmp_path / "ranker", tmp_path / "missing") == 1.0
    assert "missing: cannot read its layers and length" in caplog.text  # said, not silent
    assert read_cost({}, [4, 30, 0], factor) == pytest.approx(14.0)
    # two configs with the same recall: 6 Labeler + 6 ranker reads (12, or 8 at a third) against 3 + 12 (15, or 7)
    gold = {q: [1, 2] for q in IDS}
    many_lab, many_rank = _row("many_lab", gold, cost=(6, 6, 0)), _row("many_rank", gold, cost=(3, 12, 0))
    floors = {"d": {7: {"bm25": dict.fromkeys(IDS, 0.5)}}}
    six = choose({"d": [many_lab, many_rank]}, budgets=[7], floors=floors)
    two = choose({"d": [many_lab, many_rank]}, budgets=[7], floors=floors, ranker_factors={"d": factor})
    assert six["config"]["name"] == "many_lab" and two["config"]["name"] == "many_rank"


def test_rows_of_two_rankers_are_chosen_among_together_and_the_file_names_its_ranker(tmp_path):
    """Rows tuned with the student (ranker/) and with the teacher (ranker-teacher/), same recall: the cheapest rule
    costs each by its own ranker; the written loop config names the teacher's folder, outside the loop options."""
    from effrag.pipelines.efficientrag.config import build_config
    from effrag.tuning.loop_configs import write_loop_configs

    gold = {q: [1, 2] for q in IDS}
    setup = {"retriever": "bm25", "questions": "d/dev.jsonl"}
    student = {**_row("s", gold, cost=(4, 30, 0)), "setup": setup}
    teacher = {**_row("t", gold, cost=(4, 12, 0)), "setup": setup}
    student["config"] = {"hop_k": 5, "max_candidates": None}
    teacher["config"] = {"hop_k": 3, "max_candidates": None, "ranker": "ranker-teacher"}
    floors = {"d": {7: {"bm25": dict.fromkeys(IDS, 0.5)}, 10: {"bm25": dict.fromkeys(IDS, 0.5)}}}
    for factors, want in (({"d": {"ranker": 1 / 3, "ranker-teacher": 1.0}}, "ranker"),  # 14 against 16
                          ({"d": {"ranker": 1.0, "ranker-teacher": 1.0}}, "ranker-teacher")):  # 34 against 16
        write_loop_configs({"d": [student, teacher]}, tmp_path, k=2, floors=floors, ranker_factors=factors)
        written = json.loads((tmp_path / "loop-d.json").read_text())
        assert written.get("ranker", "ranker") == want and "ranker" not in written["config"]
        build_config(tmp_path / "loop-d.json")  # a valid loop config: the ranker is the file's, not an option
    assert "encoder" not in written  # BM25 rows: no dense leg to name


def test_the_written_config_names_the_encoder_its_rows_were_tuned_over_by_alias(tmp_path):
    """Rows tuned over a hybrid whose dense leg was MiniLM (the setup records the installed folder): the config names
    it ``minilm``, never the machine path; rows over two encoders are one line."""
    from effrag.models.encoders import resolve_encoder
    from effrag.pipelines.efficientrag.system import config_encoder
    from effrag.tuning.loop_configs import write_loop_configs

    gold = {q: [1, 2] for q in IDS}
    row = {**_row("s", gold, cost=(4, 30, 0)), "setup": {"retriever": "hybrid", "encoder": resolve_encoder("minilm")}}
    row["config"] = {"hop_k": 5, "max_candidates": None}
    report = write_loop_configs({"d": [row]}, tmp_path, k=2)
    written = json.loads((tmp_path / "loop-d.json").read_text())
    assert written["encoder"] == "minilm" == report["encoder"] == config_encoder(tmp_path / "loop.json")
    assert written["setup"]["encoder"] == "model" and "/" not in json.dumps(written["setup"]["encoder"])
    other = {**row, "setup": {"retriever": "hybrid", "encoder": "somewhere/multilingual-e5-small"}}
    with pytest.raises(ValueError, match="different encoders"):
        write_loop_configs({"d": [row], "e": [other]}, tmp_path, k=2)


def _weighted(link: float, gold_at: dict[str, list[int]], cost=(1, 10, 0), **extra) -> dict:
    row = _row("x", gold_at, cost=cost)
    row["config"] = {"first_hop_k": extra.pop("first_hop_k", 10), "link_weight": link, "max_candidates": None, **extra}
    return row


def test_the_one_se_rule_prefers_fewer_bonuses_within_the_noise_and_not_beyond_it():
    from effrag.tuning.crossfit import complexity

    plain = _weighted(0.0, {q: [1] for q in IDS})  # one gold of two everywhere
    lucky = _weighted(6.0, {q: ([1, 2] if q == IDS[0] else [1]) for q in IDS})  # one question better: noise
    assert complexity(plain["config"]) == (0, 0.0) and complexity(lucky["config"]) == (1, 6.0)
    assert choose({"d": [plain, lucky]}, budgets=[7])["config"]["link_weight"] == 6.0  # best recall
    assert choose({"d": [plain, lucky]}, budgets=[7], prefer="simple")["config"]["link_weight"] == 0.0
    better = _weighted(6.0, {q: [1, 2] for q in IDS})  # better on every question: beyond one standard error
    assert choose({"d": [plain, better]}, budgets=[7], prefer="simple")["config"]["link_weight"] == 6.0
    res = crossfit({"d": [plain, lucky]}, budgets=[7], k=4, prefer="recall")
    for f in res["folds"]:  # each fold's config scored on its own choosing questions and on the fold
        assert set(f["in_sample"]["d"]) == set(f["held_out"]["d"]) == {7}
    lucky_folds = [f for f in res["folds"] if f["config"]["link_weight"] == 6.0]
    assert lucky_folds and all(f["in_sample"]["d"][7] > f["held_out"]["d"][7] for f in lucky_folds)
    with pytest.raises(ValueError, match="prefer"):
        choose({"d": [plain]}, budgets=[7], prefer="fewest")


def test_with_a_bar_the_one_se_rule_compares_the_cheapest_points_pool_weights_as_one():
    floors = {"d": {7: {"bm25": {q: 0.0 for q in IDS}}}}
    # the same cost point (first_hop_k 10); the bonus's noise made its reads a little cheaper
    plain = _weighted(0.0, {q: [1] for q in IDS}, cost=(1, 10.2, 0))
    lucky = _weighted(6.0, {q: ([1, 2] if q == IDS[0] else [1]) for q in IDS}, cost=(1, 10.0, 0))
    dear = _weighted(0.0, {q: [1, 2] for q in IDS}, cost=(1, 30, 0), first_hop_k=30)  # best, but reads 3x
    rows = {"d": [plain, lucky, dear]}
    assert choose(rows, budgets=[7], floors=floors)["config"]["link_weight"] == 6.0  # cheapest by a hair
    pick = choose(rows, budgets=[7], floors=floors, prefer="simple")["config"]
    assert (pick["first_hop_k"], pick["link_weight"]) == (10, 0.0)


def test_recall_first_the_cheaper_point_wins_only_within_the_noise_of_held_out_recall():
    """prefer="cheap" (issue #67): cost points compete on their cross-fitted recall; the cheaper point ships only when
    its held-out recall is within one standard error of the best point's."""
    dear = _weighted(0.0, {q: [1, 2] for q in IDS}, cost=(1, 30, 0), first_hop_k=30)
    near = _weighted(0.0, {q: ([1] if q == IDS[0] else [1, 2]) for q in IDS}, cost=(1, 10, 0))  # one question worse
    far = _weighted(0.0, {q: ([1] if i % 2 else [1, 2]) for i, q in enumerate(IDS)}, cost=(1, 10, 0))  # half worse
    assert choose({"d": [dear, near]}, budgets=[7], prefer="cheap")["config"]["first_hop_k"] == 10
    assert choose({"d": [dear, far]}, budgets=[7], prefer="cheap")["config"]["first_hop_k"] == 30
    assert choose({"d": [dear, near]}, budgets=[7], prefer="recall")["config"]["first_hop_k"] == 30
    res = crossfit({"d": [dear, far]}, budgets=[7], k=4, prefer="cheap")  # nested: each outer fold chooses alone
    assert all(f["config"]["first_hop_k"] == 30 for f in res["folds"]) and res["datasets"]["d"]["recall"][7] == 1.0


def test_a_dataset_whose_own_rule_does_not_beat_loop_json_ships_loop_json(tmp_path):
    import json as _json

    from effrag.tuning.loop_configs import write_loop_configs

    def rows(gold_a, gold_b):
        a = _weighted(0.0, gold_a, first_hop_k=10)
        b = _weighted(6.0, gold_b, first_hop_k=10)
        for r in (a, b):
            r["setup"] = {"retriever": "bm25", "encoder": None}
        return [a, b]

    good = {q: [1, 2] for q in IDS}
    half = {q: [1] for q in IDS}
    tunes = {"x": rows(good, half), "y": rows(half, good)}  # x best with link 0, y with link 6: jointly a tie
    bars = {d: {7: {"bm25": {q: 0.25 for q in IDS}}} for d in tunes}
    rep = write_loop_configs(tunes, tmp_path, budgets=[7], k=4, fall_back=True, bars=bars, targets={7: 20})
    general = _json.loads((tmp_path / "loop.json").read_text())["config"]
    for d in tunes:
        mine = _json.loads((tmp_path / f"loop-{d}.json").read_text())
        ships = rep["per_dataset"][d]["ships"]
        assert ships == ("loop.json" if mine["config"] == general else "own")
        if ships == "loop.json":
            assert "did not beat loop.json's" in mine["chosen_on"]["questions"]
            assert mine["crossfit"][d] == _json.loads((tmp_path / "loop.json").read_text())["crossfit"][d]
        m = rep["per_dataset"][d]["margins"][7]
        assert m["margin_needed"] == pytest.approx(max(m["gap"], 0) + m["se"])
        assert m["keeps"] == (m["lead_in_sample"] - max(m["gap"], 0) >= m["se"] - 1e-12)
    # jointly a tie, broken towards one dataset's best: that one's own rule does not beat it, the other's does
    assert sorted(rep["per_dataset"][d]["ships"] for d in tunes) == ["loop.json", "own"]
    same = {"x": rows(good, half), "y": rows(good, half)}  # the joint pick is each one's own: no own rule beats it
    rep = write_loop_configs(same, tmp_path, budgets=[7], k=4, fall_back=True)
    assert {rep["per_dataset"][d]["ships"] for d in same} == {"loop.json"}
    assert "did not beat loop.json's" in _json.loads((tmp_path / "loop-x.json").read_text())["chosen_on"]["questions"]
