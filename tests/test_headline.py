"""Issue #72: the README's results table is read off the committed evidence (reports/headline.json names it), so
a figure is kept once; the README fails here when it is stale, and a shipped file the evidence no longer makes
cannot be rendered."""
import json
import shutil
from pathlib import Path

import pytest

from effrag.evaluation.headline import END, START, headline_markdown, headline_rows, replace_block

ROOT = Path(__file__).resolve().parents[1]
SPEC = json.loads((ROOT / "reports" / "headline.json").read_text())


def test_the_readme_table_is_what_the_evidence_says():
    readme = (ROOT / "README.md").read_text()
    block = readme.split(START, 1)[1].split(END, 1)[0]
    assert block == "\n" + headline_markdown(SPEC, ROOT), "README.md is stale: python scripts/render_headline.py"


def test_each_row_is_one_shipped_file_against_its_bar():
    rows = {r["dataset"]: r for r in headline_rows(SPEC, ROOT)}
    assert set(rows) == {"hotpotqa", "2wikimqa", "musique"}
    for ds, r in rows.items():
        shipped = json.loads((ROOT / SPEC["system"] / f"loop-{ds}.json").read_text())["crossfit"][ds]
        assert round(r["recall"]["7"], 4) == shipped["recall"]["7"] and r["n"] == shipped["n"]
        assert r["recall"]["5"] <= r["recall"]["7"] <= r["recall"]["10"] and r["pfe"][0] > 0 and r["index_pfe"] > 0
    assert rows["musique"]["bar"]["7"][1] == "hybrid"  # the hybrid fused at k is named as the hybrid


def test_a_shipped_file_the_evidence_no_longer_makes_is_refused(tmp_path):
    system = tmp_path / "system"
    shutil.copytree(ROOT / SPEC["system"], system, ignore=shutil.ignore_patterns("*.safetensors", "set-ranker"))
    cfg = json.loads((system / "loop-musique.json").read_text())
    cfg["crossfit"]["musique"]["recall"]["7"] += 0.01
    (system / "loop-musique.json").write_text(json.dumps(cfg))
    spec = {**SPEC, "system": str(system)}
    with pytest.raises(ValueError, match=r"loop-musique.json: its cross-fitted recall .* is not the evidence's"):
        headline_rows(spec, ROOT)


def test_the_block_is_replaced_between_its_markers_only():
    text = f"# t\n\n{START}\nold\n{END}\n\ntail\n"
    assert replace_block(text, "new\n") == f"# t\n\n{START}\nnew\n{END}\n\ntail\n"
    with pytest.raises(ValueError, match="no <!-- headline:start -->"):
        replace_block("# no markers\n", "new\n")
