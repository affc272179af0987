"""Issue #72: the headline figures are read off the committed evidence (reports/headline.json names it), so a figure
is kept once. Three texts render from it: the README's results table, the shipped card's figures, cost and dev
figures, and the README's copy of what the quickstart prints. Each fails here when it is stale, and a shipped file
the evidence no longer makes cannot be rendered."""
import json
import shutil
from pathlib import Path

import pytest
from helpers import run_script

from effrag.headline import (
    END,
    START,
    card_markdown,
    headline_rows,
    inputs_digest,
    markers,
    quickstart_inputs_stale,
    render_targets,
    rendered_blocks,
    replace_block,
)
from effrag.pretrained import LOOP_FILES

ROOT = Path(__file__).resolve().parents[1]
SPEC = json.loads((ROOT / "reports" / "headline.json").read_text())
CARD = f"{SPEC['system']}/README.md"


def test_every_rendered_text_is_what_the_evidence_says():
    targets = render_targets(SPEC, ROOT)
    assert set(targets) == {"README.md", CARD}
    for path, (now, new) in targets.items():
        assert now == new, f"{path} is stale: python scripts/render_headline.py"
    names = {(path, name) for path, name, _ in rendered_blocks(SPEC, ROOT)}
    assert names == {("README.md", "headline"), ("README.md", "quickstart"), (CARD, "headline"), (CARD, "dev-figures")}


def test_the_card_holds_no_figure_outside_its_rendered_blocks():
    """The card's cost and cross-fitted figures are rendered, not typed: outside its blocks no figure is left."""
    card = (ROOT / CARD).read_text()
    for name in ("headline", "dev-figures"):
        start, end = markers(name)
        card = card.split(start)[0] + card.split(end)[1]
    assert "## Cost" not in card and "| `loop" not in card and "pfe" not in card
    assert "2,628" not in card and "6.6 / 10.3" not in card


def test_the_card_is_what_export_writes_with_its_blocks_rendered():
    """Outside its rendered blocks the card is what export writes (effrag.training.export.shipped_card): no figure or
    line of it is typed by hand."""
    from effrag.training.export import shipped_card

    system = ROOT / SPEC["system"]
    export = json.loads((system / "export.json").read_text())
    head = shipped_card(system, export.get("int8_bytes", {}), source=export.get("source"))
    card = render_targets(SPEC, ROOT)[CARD][1]
    assert card.split("\n## Dev figures")[0].rstrip() + "\n" == replace_block(head, card_markdown(SPEC, ROOT))


def _evidence_root(tmp_path: Path) -> Path:
    """A checkout holding only what the renderer reads: the rendered files and the evidence the spec names."""
    report = Path(SPEC["recall"]["report"]).parent
    files = ["README.md", CARD, *(f"{SPEC['system']}/{f}" for f in LOOP_FILES), SPEC["recall"]["evidence"],
             str(report / "table2.md"), str(report / "curve.md"), *SPEC["cost"]["benches"].values(),
             *SPEC["cost"]["general"].values(), SPEC["index"]["evidence"], SPEC["quickstart"]["evidence"]]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    assert all(now == new for now, new in render_targets(SPEC, tmp_path).values())
    return tmp_path


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _stale(root: Path) -> set[str]:
    return {path for path, (now, new) in render_targets(SPEC, root).items() if now != new}


def _shipped_row(bench: dict) -> dict:
    (row,) = [r for r in bench["rows"] if r["name"] == "shipped"]
    return row


def test_each_rendered_text_is_stale_when_its_evidence_changes(tmp_path):
    root = _evidence_root(tmp_path)
    # the index-cost bench: the README's table and the card's cost
    index = root / SPEC["index"]["evidence"]
    saved = index.read_text()
    _edit_json(index, lambda r: r["datasets"][0]["rows"][-1].update(pfe_per_1k=9999.0))
    assert _stale(root) == {"README.md", CARD}
    index.write_text(saved)
    # loop.json's cost bench: the card alone
    _edit_json(root / SPEC["cost"]["general"]["musique"], lambda b: _shipped_row(b).update(ratio=99.0))
    assert _stale(root) == {CARD}
    shutil.copy(ROOT / SPEC["cost"]["general"]["musique"], root / SPEC["cost"]["general"]["musique"])
    # the quickstart's committed output: the README's copy of its table
    _edit_json(root / SPEC["quickstart"]["evidence"],
               lambda s: s[2].update({"efficientrag@7": 0.9, "bar7_margin": 0.017}))
    assert _stale(root) == {"README.md"}
    shutil.copy(ROOT / SPEC["quickstart"]["evidence"], root / SPEC["quickstart"]["evidence"])
    # the recall report's curve: the card's dev figures
    curve = root / Path(SPEC["recall"]["report"]).parent / "curve.md"
    curve.write_text(curve.read_text().replace("| 76.5 |", "| 77.0 |"))
    assert _stale(root) == {CARD}
    shutil.copy(ROOT / Path(SPEC["recall"]["report"]).parent / "curve.md", curve)
    # a block edited by hand is stale too
    card = root / CARD
    card.write_text(card.read_text().replace("`loop-musique.json` 6.5 / 8.9", "`loop-musique.json` 6.0 / 8.9"))
    assert _stale(root) == {CARD}


def test_check_exits_1_on_a_stale_text_and_the_render_mends_it(tmp_path):
    root = _evidence_root(tmp_path / "root")
    spec = {**SPEC, "quickstart": {**SPEC["quickstart"], "inputs": [], "inputs_sha256": inputs_digest(root, [])}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    args = ("--spec", tmp_path / "spec.json", "--root", root)
    proc = run_script("render_headline", *args, "--check")
    assert proc.returncode == 0 and f"{CARD}: current" in proc.stdout, proc.stdout + proc.stderr
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("│ musique   │   88.3 dense │", "│ musique   │   90.0 dense │"))
    proc = run_script("render_headline", *args, "--check")
    assert proc.returncode == 1 and "README.md: stale" in proc.stdout, proc.stdout + proc.stderr
    proc = run_script("render_headline", *args)
    assert proc.returncode == 0 and "written: README.md" in proc.stdout, proc.stdout + proc.stderr
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_each_row_is_one_shipped_file_against_its_bar():
    rows = {r["dataset"]: r for r in headline_rows(SPEC, ROOT)}
    assert set(rows) == {"hotpotqa", "2wikimqa", "musique"}
    for ds, r in rows.items():
        shipped = json.loads((ROOT / SPEC["system"] / f"loop-{ds}.json").read_text())["crossfit"][ds]
        assert round(r["recall"]["7"], 4) == shipped["recall"]["7"] and r["n"] == shipped["n"]
        assert r["recall"]["5"] <= r["recall"]["7"] <= r["recall"]["10"] and r["pfe"][0] > 0 and r["index_pfe"] > 0
    assert rows["musique"]["bar"]["7"][1] == "hybrid"  # the hybrid fused at k is named as the hybrid


def _system_copy(tmp_path: Path) -> Path:
    system = tmp_path / "system"
    shutil.copytree(ROOT / SPEC["system"], system, ignore=shutil.ignore_patterns("*.safetensors", "set-ranker"))
    return system


def test_a_shipped_file_the_evidence_no_longer_makes_is_refused(tmp_path):
    system = _system_copy(tmp_path)
    _edit_json(system / "loop-musique.json", lambda c: c["crossfit"]["musique"]["recall"].update({"7": 0.74}))
    spec = {**SPEC, "system": str(system)}
    with pytest.raises(ValueError, match=r"loop-musique.json: its cross-fitted recall .* is not the evidence's"):
        headline_rows(spec, ROOT)


def test_a_bench_of_another_config_is_refused(tmp_path):
    """A cost bench counts only for the config it ran: a shipped file retuned since is refused until it is rerun."""
    system = _system_copy(tmp_path)
    _edit_json(system / "loop.json", lambda c: c["config"].update(hop_k=7))
    spec = {**SPEC, "system": str(system)}
    headline_rows(spec, ROOT)  # the README's table reads the per-dataset files only
    with pytest.raises(ValueError, match=r"cpu-v8-general-hotpotqa/report.json: it benched another config"):
        render_targets(spec, ROOT)


def test_the_quickstart_inputs_count_what_it_runs_with(tmp_path):
    """The digest that ties the committed quickstart output to the shipped system and the sample moves with a loop
    file's config, and not with its figures or the card."""
    system = _system_copy(tmp_path)
    before = inputs_digest(tmp_path, ["system"])
    (system / "README.md").write_text("another card\n")
    _edit_json(system / "loop.json", lambda c: c["crossfit"]["hotpotqa"]["recall"].update({"7": 0.5}))
    assert inputs_digest(tmp_path, ["system"]) == before
    _edit_json(system / "loop.json", lambda c: c["config"].update(hop_k=7))
    assert inputs_digest(tmp_path, ["system"]) != before
    spec = {**SPEC, "quickstart": {**SPEC["quickstart"], "inputs": ["system"], "inputs_sha256": before}}
    assert "summary.json is stale: the shipped system or the sample changed" in quickstart_inputs_stale(spec, tmp_path)


def test_the_block_is_replaced_between_its_markers_only():
    text = f"# t\n\n{START}\nold\n{END}\n\ntail\n"
    assert replace_block(text, "new\n") == f"# t\n\n{START}\nnew\n{END}\n\ntail\n"
    start, end = markers("quickstart")
    both = text + f"{start}\nold\n{end}\n"
    assert replace_block(both, "new\n", "quickstart") == text + f"{start}\nnew\n{end}\n"
    with pytest.raises(ValueError, match="no <!-- headline:start -->"):
        replace_block("# no markers\n", "new\n")
