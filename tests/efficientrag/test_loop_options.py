"""EfficientRAG's loop options: one rule per option (type, range, allowed values), shared by the CLI, loop config
files, ``from_pretrained``, the service and the HTTP API (issue #40 §5-7). serve.yaml start-up cases are in
tests/serve/test_serve.py (``test_start_up_errors_are_one_line``), the HTTP body's in ``test_bad_requests_get_clear_errors``.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from effrag.api import EfficientRAG
from effrag.data import sample_path
from effrag.pipelines.efficientrag.config import RULES, EfficientRAGConfig, build_config

HOTPOT_DEV = sample_path("hotpotqa", "dev")


def test_every_loop_option_has_one_rule():
    assert set(RULES) == {f.name for f in fields(EfficientRAGConfig)}
    defaults = EfficientRAGConfig()
    assert all(RULES[f.name].accepts(getattr(defaults, f.name)) for f in fields(EfficientRAGConfig))


# a loop config file's content -> the one line naming the key (the file's path comes first)
BAD_FILES = {
    "threshold a string": ({"tag_threshold": "high"}, "tag_threshold must be a number from 0 to 1, got 'high'"),
    "threshold out of range": ({"tag_threshold": 7.5}, "tag_threshold must be a number from 0 to 1, got 7.5"),
    "negative threshold": ({"filter_threshold": -0.1}, "filter_threshold must be a number from 0 to 1, got -0.1"),
    "hops a string": ({"max_hops": "3"}, "max_hops must be an integer >= 1, got '3'"),
    "hops a fraction": ({"max_hops": 2.5}, "max_hops must be an integer >= 1, got 2.5"),
    "hops zero": ({"max_hops": 0}, "max_hops must be an integer >= 1, got 0"),
    "hops true": ({"max_hops": True}, "max_hops must be an integer >= 1, got True"),
    "unknown mode": ({"config": {"query_mode": "both"}}, "config.query_mode must be one of merged, per_chunk, got 'both'"),
    "flag a string": ({"bf16": "yes"}, "bf16 must be true or false, got 'yes'"),
    "weight NaN": ({"retrieval_weight": float("nan")}, "retrieval_weight must be a number, got nan"),
    "cap a string": ({"config": {"max_candidates": "10"}},
                     "config.max_candidates must be an integer >= 1 (or null), got '10'"),
    "a JSON list": ([{"tag_threshold": 0.5}], "the loop options must be a JSON object of loop options, got list"),
    "config a list": ({"config": [1]}, "config must be a JSON object of loop options, got list"),
}


def _write(tmp_path: Path, content) -> Path:
    f = tmp_path / "loop.json"
    f.write_text(json.dumps(content))
    return f


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_loop_config_files_with_wrong_types_or_ranges_name_file_and_key(tmp_path, case):
    content, message = BAD_FILES[case]
    f = _write(tmp_path, content)
    with pytest.raises(ValueError) as e:
        build_config(str(f))
    assert str(e.value) == f"{f}: {message}"


def test_options_in_code_and_flags_follow_the_same_rule(tiny_efficientrag_dirs, tmp_path):
    with pytest.raises(ValueError, match=r"^EfficientRAGConfig\.tag_threshold must be a number from 0 to 1, got 7\.5$"):
        EfficientRAGConfig(tag_threshold=7.5)
    with pytest.raises(ValueError, match=r"^EfficientRAG option: max_hops must be an integer >= 1, got '3'$"):
        build_config(None, max_hops="3")
    assert EfficientRAGConfig(tag_threshold=1, max_hops=2).replace(tag_threshold=0.0).tag_threshold == 0.0

    def no_models(*a, **kw):
        raise AssertionError("models were loaded before the options were checked")

    import effrag.pipelines.efficientrag.pipeline as pipeline

    f = _write(tmp_path, {"config": {"tag_threshold": 7.5}})
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pipeline, "load_models", no_models)
        with pytest.raises(ValueError, match=rf"^{f}: config\.tag_threshold must be a number from 0 to 1, got 7\.5$"):
            EfficientRAG.from_pretrained(tiny_efficientrag_dirs["labeler"], tiny_efficientrag_dirs["filter"],
                                         retriever=lambda qs, k: [[] for _ in qs], config=str(f))
        with pytest.raises(ValueError, match=r"EfficientRAG option: tag_threshold must be a number from 0 to 1, "
                                             r"got 'high'"):
            EfficientRAG.from_pretrained(tiny_efficientrag_dirs["labeler"], tiny_efficientrag_dirs["filter"],
                                         retriever=lambda qs, k: [[] for _ in qs], tag_threshold="high")


@pytest.mark.parametrize("extra, message", [
    (["--er-config", "{loop}"], "{loop}: max_hops must be an integer >= 1, got 2.5"),
    (["--tag-threshold", "7.5"], "EfficientRAG option: tag_threshold must be a number from 0 to 1, got 7.5"),
])
def test_cli_checks_loop_options_before_reading_the_corpus(tiny_efficientrag_dirs, tmp_path, capsys, monkeypatch,
                                                           extra, message):
    from effrag import setup
    from effrag.cli import main

    def no_setup(*a, **kw):
        raise AssertionError("the run setup was built before the options were checked")

    monkeypatch.setattr(setup.RunSetup, "from_args", classmethod(no_setup))
    loop = _write(tmp_path, {"max_hops": 2.5})
    code = main(["eval", "--method", "efficientrag", "--labeler", str(tiny_efficientrag_dirs["labeler"]),
                 "--filter", str(tiny_efficientrag_dirs["filter"]), "--questions", str(HOTPOT_DEV),
                 "--corpus-from", str(HOTPOT_DEV), "--retriever", "bm25", "--output", str(tmp_path / "out"),
                 *[a.format(loop=loop) for a in extra]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].endswith(message.format(loop=loop)), err


def test_every_loop_option_is_one_field_with_a_flag_and_a_docs_row(capsys):
    """A new option is one field (efficientrag.config.option): its rule, its effrag eval flag and its docs row are
    read off it, and the flag's value reaches the loop's config."""
    import argparse

    from effrag.cli_args import add_method_args, method_options
    from effrag.pipelines.efficientrag.config import cli_flags, options_table
    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline

    p = argparse.ArgumentParser()
    add_method_args(p, "efficientrag")
    dests = {a.dest for a in p._actions}
    flags = {f.name: f for f in cli_flags()}
    assert set(flags) == {f.name for f in fields(EfficientRAGConfig)}
    assert all(f.dest in dests for f in flags.values())
    args = p.parse_args(["--link-weight", "3", "--backlink-weight", "1.5", "--link-top", "4", "--chunk-format", "text",
                         "--filter-max-length", "64", "--pool-order", "rank", "--er-batch-size",
                         "8", "--pool-source", "seen", "--no-label-last-hop"])
    opts = {k: v for k, v in method_options(args).items() if v is not None}
    cfg = EfficientRAGPipeline._config(None, None, opts.pop("er_batch_size"), opts.pop("er_bf16", None), **opts)
    assert (cfg.link_weight, cfg.backlink_weight, cfg.link_top, cfg.chunk_format, cfg.filter_max_length,
            cfg.batch_size, cfg.label_last_hop) == (3.0, 1.5, 4, "text", 64, 8, False)
    with pytest.raises(SystemExit):
        p.parse_args(["--chunk-format", "html"])  # the rule's choices are the flag's
    assert "html" in capsys.readouterr().err
    docs = (Path(__file__).resolve().parents[2] / "docs" / "loop_options.md").read_text()
    assert docs.endswith(options_table()), ("docs/loop_options.md is stale: rewrite its table with "
                                            "effrag.pipelines.efficientrag.config.options_table()")


def test_options_have_a_group_and_the_groups_decide_pool_runs_requests_and_old_files():
    """Each option is in one group (loop, pool, runtime): the pool group is what configs sharing one loop run may
    differ in, a service request may set every group but runtime, and an option with a ``since`` date is left out
    of a config's JSON at its default (a file written before it existed is the same JSON)."""
    from effrag.pipelines.efficientrag.config import GROUPS, OPTION_GROUPS, POOL_OPTIONS, request_options
    from effrag.tuning import loop_key

    names = [f.name for f in fields(EfficientRAGConfig)]
    assert sorted(n for g in GROUPS for n in OPTION_GROUPS[g]) == sorted(names)
    assert POOL_OPTIONS == set(OPTION_GROUPS["pool"]) and {"pool_order", "set_ranker_top"} <= POOL_OPTIONS
    assert set(request_options()) == set(names) - set(OPTION_GROUPS["runtime"])
    assert set(OPTION_GROUPS["runtime"]) == {"batch_size", "bf16", "int8"}
    base = EfficientRAGConfig(pool_order="rank")
    assert loop_key(base) == loop_key(base.replace(link_weight=2.0, max_candidates=7))  # pool options: one run
    assert loop_key(base) != loop_key(base.replace(hop_k=3))
    since = {f.name for f in fields(EfficientRAGConfig) if f.metadata["since"]}
    assert {"int8", "set_ranker_top", "label_last_hop"} <= since and "hop_k" not in since
    assert set(EfficientRAGConfig().to_json()) == set(names) - since
    assert EfficientRAGConfig(link_top=3).to_json()["link_top"] == 3
    with pytest.raises(ValueError, match="option group"):
        from effrag.pipelines.efficientrag.config import Rule, option
        option(1, Rule(int), "x", group="other")
