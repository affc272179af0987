"""The shared options of effrag.cli_args (issue #72): one declaration each, and no script declaring one by hand.

Read from the scripts' source with ``ast`` (no script runs): an ``add_argument("--output", ...)`` in a script is an
option spelled, typed and explained its own way, where ``add_output_arg`` gives the one every script shares.
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from effrag import cli_args
from effrag.data.loaders import MULTIHOP_DATASETS

ROOT = Path(__file__).resolve().parents[1]

# a shared spelling a script uses for another thing: kept, because committed commands cite it
HOMONYMS = {
    ("bench_vector_store.py", "--questions"): "a count of dev questions, not a file",
    ("verify_e5.py", "--questions"): "a count of questions, not a file",
}
# an alias a shared option keeps for old commands, which other scripts spell for something else
ALIAS_HOMONYMS = {"--model": "bench_index_cost's and bench_loop_cost's old --checkpoints; elsewhere a model folder"}


def shared_flags() -> set[str]:
    """Every option string the shared helpers declare (``add_method_args`` aside: the method's own options)."""
    calls = [(fn, (), {}) for name, fn in vars(cli_args).items()
             if name.startswith("add_") and callable(fn) and name not in ("add_method_args", "add_checkpoints_arg")]
    calls += [(cli_args.add_checkpoints_arg, ("efficientrag-all",), {}), (cli_args.add_bf16_arg, (), {"default": True})]
    flags = set()
    for fn, args, kwargs in calls:
        p = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        fn(p, *args, **kwargs)
        flags |= {s for a in p._actions for s in a.option_strings}
    return flags - set(ALIAS_HOMONYMS)


def hand_declared(source: str, flags: set[str]) -> list[tuple[int, str]]:
    """(line, flag) of each ``add_argument`` call in ``source`` that names one of ``flags`` itself."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            out += [(node.lineno, a.value) for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in flags]
    return out


def scripts() -> list[Path]:
    return sorted(p for d in ("", "device", "probes") for p in (ROOT / "scripts" / d).glob("*.py"))


def test_the_shared_flags_are_the_ones_scripts_repeat():
    flags = shared_flags()
    assert {"--data", "--data-dir", "--datasets", "--limit", "--output", "--out", "--seed", "--threads", "--encoder",
            "--bf16", "--no-bf16", "--retriever", "--questions", "--corpus-from", "--llm", "--reader", "--irrr",
            "--batch-size", "--allow-dirty", "--budgets", "--keep-sample", "--system", "--evidence", "--work",
            "--checkpoints"} <= flags


def test_the_static_check_finds_a_hand_declared_flag():
    source = ("import argparse\nfrom effrag.cli_args import add_output_arg\np = argparse.ArgumentParser()\n"
              "add_output_arg(p)\np.add_argument('--k', type=int)\ng = p.add_argument_group('x')\n"
              "g.add_argument('--encoder', help='mine')\np.add_argument('--seed', type=int, default=1)\n")
    assert hand_declared(source, shared_flags()) == [(7, "--encoder"), (8, "--seed")]


def test_no_script_declares_a_shared_flag_by_hand():
    flags = shared_flags()
    found = {f"{p.relative_to(ROOT)}:{line} {flag}" for p in scripts()
             for line, flag in hand_declared(p.read_text(encoding="utf-8"), flags) if (p.name, flag) not in HOMONYMS}
    assert not found, (f"{sorted(found)}: declare these with the effrag.cli_args helper that has them (add_output_arg, "
                       "add_seed_arg, ...), or list a flag that means something else here in HOMONYMS with why")
    gone = {s for s, _ in HOMONYMS} - {p.name for p in scripts()}
    assert not gone, f"HOMONYMS names scripts that are gone: {sorted(gone)}"


def test_encoder_and_bf16_are_declared_once_in_the_package():
    """``--encoder`` had a help text per command; every CLI of the package takes it from cli_args now."""
    found = [f"{p.relative_to(ROOT)}:{line}" for d in ("effrag", "data_synthesis") for p in sorted((ROOT / d).rglob("*.py"))
             if p.name != "cli_args.py"
             for line, _ in hand_declared(p.read_text(encoding="utf-8"), {"--encoder", "--bf16", "--no-bf16"})]
    assert not found, found


def test_no_script_spells_a_dataset_name():
    """The multi-hop datasets come from effrag.data.loaders.MULTIHOP_DATASETS (cli_args.DATASETS), not literals."""
    names = set(MULTIHOP_DATASETS)
    found = [f"{p.relative_to(ROOT)}:{n.lineno} {n.value!r}" for p in scripts()
             for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]
    assert not found, found


# ---------------------------------------------------------------------- the helpers' behaviour
def parse(add, argv, **kw):
    p = argparse.ArgumentParser()
    add(p, **kw)
    return p.parse_args(argv)


def test_old_spellings_stay_aliases():
    assert parse(cli_args.add_output_arg, ["--out", "x"]).output == Path("x")
    assert parse(cli_args.add_output_arg, ["--output", "x"], dest="out").out == Path("x")
    assert parse(cli_args.add_output_arg, [], default="reports/r").output == Path("reports/r")
    assert parse(cli_args.add_data_dir_arg, ["--data-dir", "d"]).data == Path("d")
    assert parse(cli_args.add_checkpoints_arg, ["--model", "m"], default="efficientrag-all").checkpoints == "m"
    assert parse(cli_args.add_questions_arg, ["--data", "f.jsonl"], aliases=("--data",)).questions == "f.jsonl"


def test_list_options_take_spaces_or_commas():
    assert parse(cli_args.add_datasets_arg, []).datasets == list(MULTIHOP_DATASETS)
    assert parse(cli_args.add_datasets_arg, ["--datasets", "hotpotqa,musique"]).datasets == ["hotpotqa", "musique"]
    assert parse(cli_args.add_datasets_arg, ["--datasets", "hotpotqa", "musique"]).datasets == ["hotpotqa", "musique"]
    assert parse(cli_args.add_datasets_arg, ["--datasets", "mine"]).datasets == ["mine"]
    with pytest.raises(SystemExit):
        parse(cli_args.add_datasets_arg, ["--datasets", "mine"], only_these=True)
    assert parse(cli_args.add_budgets_arg, ["--budgets", "5", "7"]).budgets == [5, 7]
    assert parse(cli_args.add_budgets_arg, ["--budgets", "5,7,10"], one_value=True).budgets == [5, 7, 10]
    with pytest.raises(SystemExit):
        parse(cli_args.add_budgets_arg, ["--budgets", "x"])


def test_limit_bf16_and_threads():
    assert parse(cli_args.add_limit_arg, []).limit is None
    assert parse(cli_args.add_limit_arg, [], default=64).limit == 64
    assert parse(cli_args.add_limit_arg, ["--limit", "0"], default=0, zero_all=True).limit == 0
    with pytest.raises(SystemExit):
        parse(cli_args.add_limit_arg, ["--limit", "0"])
    assert parse(cli_args.add_bf16_arg, []).bf16 is False
    assert parse(cli_args.add_bf16_arg, [], default=True).bf16 is True
    assert parse(cli_args.add_bf16_arg, ["--no-bf16"], default=True).bf16 is False
    assert parse(cli_args.add_threads_arg, []).threads is None
    assert parse(cli_args.add_seed_arg, [], default=42).seed == 42
