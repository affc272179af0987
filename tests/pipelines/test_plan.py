"""Issue #72, goal 3: a front door plans the method once (its options checked, its settings file chosen, the
retriever and encoder they were tuned over, the depth), sets up the retriever, then builds."""
import pytest

from effrag.pipelines import get_pipeline_class


def test_the_shipped_system_is_resolved_once_for_the_questions_dataset(monkeypatch):
    import effrag.pipelines.efficientrag.system as system

    opened = []
    real = system.open_system
    monkeypatch.setattr(system, "open_system", lambda *a, **kw: opened.append(a) or real(*a, **kw))
    cls = get_pipeline_class("efficientrag")
    plan = cls.plan({}, dataset="musique")
    assert len(opened) == 1  # eval used to open the system folder up to 6 times
    assert (plan.retriever, plan.encoder) == ("hybrid", "e5-small") and plan.settings.endswith("loop-musique.json")
    assert plan.k is None and cls.plan({}, k=7).k == 7  # its depth lives in its loop config unless k is given
    general = cls.plan({}, dataset="bamboogle")  # no loop-bamboogle.json: the general loop.json
    assert general.settings.endswith("loop.json") and general.dataset == "bamboogle"


def test_a_bad_option_fails_at_planning_before_anything_loads():
    cls = get_pipeline_class("efficientrag")
    with pytest.raises(ValueError, match="tag_threshold"):
        cls.plan({"tag_threshold": "high"})
    with pytest.raises(ValueError, match="not both"):
        cls.plan({"model": "efficientrag-all", "labeler": "L", "filter": "F"})


def test_a_plain_method_plans_its_default_depth_and_tunes_over_nothing():
    cls = get_pipeline_class("direct-r")
    plan = cls.plan({}, default_k=10)
    assert (plan.k, plan.retriever, plan.encoder, plan.settings) == (10, None, None, None)
    assert cls.plan({}, k=3, default_k=10).k == 3
    assert plan.warnings("bm25") == []  # nothing tuned: nothing to warn about


def test_warnings_name_a_retriever_kind_the_settings_were_not_tuned_over():
    plan = get_pipeline_class("efficientrag").plan({}, dataset="hotpotqa")
    (warning,) = plan.warnings("bm25", index="idx")
    assert "tuned over a hybrid retriever; this run uses bm25 (index idx)" in warning
    assert plan.warnings("hybrid") == [] and plan.warnings(None) == []


def test_build_passes_the_planned_options_and_depth_and_never_overrides_them():
    from effrag.data import build_corpus, sample_path
    from effrag.retrieval import build_retriever

    corpus = build_corpus([sample_path("hotpotqa", "dev")])
    retriever = build_retriever("bm25", corpus)
    plan = get_pipeline_class("direct-r").plan({}, k=4)
    pipeline = plan.build(retriever, k=9)  # a door's extra k cannot undo the plan's
    result = pipeline.run("Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?")
    assert len(result.chunks) == 4
