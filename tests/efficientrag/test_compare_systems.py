"""Issue #71: a recipe run is compared with the shipped system by its picks and its cross-fitted recall, and the
exported folder keeps only the rankers its loop configs read."""
import json
import shutil
from pathlib import Path

import pytest

from effrag.pretrained import pretrained_path
from effrag.tuning.compare_systems import LOOP_FILES, compare_systems, comparison_markdown


def _loop_copy(tmp_path: Path) -> tuple[Path, Path]:
    shipped = Path(pretrained_path("efficientrag-all"))
    copy = tmp_path / "run"
    copy.mkdir()
    for name in LOOP_FILES:
        shutil.copy(shipped / name, copy / name)
    return shipped, copy


def _edit(path: Path, change) -> None:
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def test_a_copy_of_the_shipped_system_is_within_noise_of_it(tmp_path):
    shipped, copy = _loop_copy(tmp_path)
    result = compare_systems(copy, shipped)
    assert result["verdict"] and set(result["files"]) == set(LOOP_FILES)
    assert result["files"]["loop.json"]["recall"].keys() == {"hotpotqa", "2wikimqa", "musique"}
    assert "**Yes.**" in comparison_markdown(result)


def test_a_changed_pick_or_a_recall_off_by_more_than_a_point_is_named(tmp_path):
    shipped, copy = _loop_copy(tmp_path)
    _edit(copy / "loop-hotpotqa.json", lambda c: c["config"].update(link_weight=0.0))
    _edit(copy / "loop-musique.json", lambda c: c.update(ranker="ranker"))
    result = compare_systems(copy, shipped)
    files = result["files"]
    assert not result["verdict"]
    assert files["loop-hotpotqa.json"]["differ"] == {"link_weight": [0.0, 9.0]}
    assert files["loop-musique.json"]["differ"] == {"ranker": ["ranker", "ranker-late"]}
    assert files["loop-hotpotqa.json"]["within"] and files["loop.json"]["same_pick"]

    (tmp_path / "second").mkdir()
    shipped, copy = _loop_copy(tmp_path / "second")
    recall = json.loads((shipped / "loop-musique.json").read_text())["crossfit"]["musique"]["recall"]["7"]
    _edit(copy / "loop-musique.json", lambda c: c["crossfit"]["musique"]["recall"].update({"7": recall - 0.011}))
    result = compare_systems(copy, shipped)
    assert not result["verdict"] and result["files"]["loop-musique.json"]["same_pick"]
    assert not result["files"]["loop-musique.json"]["within"]
    md = comparison_markdown(result)
    assert "**No.**" in md and "| `loop-musique.json` | musique | yes |" in md and "-1.1 / +0.0 | no |" in md
    _edit(copy / "loop-musique.json", lambda c: c["crossfit"]["musique"]["recall"].update({"7": recall - 0.009}))
    assert compare_systems(copy, shipped)["verdict"]


def test_a_missing_or_foreign_loop_file_is_one_error_naming_it(tmp_path):
    shipped, copy = _loop_copy(tmp_path)
    (copy / "loop-2wikimqa.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"run/loop-2wikimqa.json: no such loop config"):
        compare_systems(copy, shipped)
    (copy / "loop-2wikimqa.json").write_text('{"options": {}}')
    with pytest.raises(ValueError, match=r"loop-2wikimqa.json.*no 'config' field"):
        compare_systems(copy, shipped)


def test_prune_drops_the_rankers_no_loop_config_reads(tmp_path):
    from effrag.training.export import prune_rankers

    shipped, system = _loop_copy(tmp_path)
    for name in ("ranker", "ranker-late", "ranker-teacher", "set-ranker", "labeler"):
        (system / name).mkdir()
        (system / name / "weights").write_bytes(b"x")
    (system / "export.json").write_text(json.dumps({"source_sha256": {"ranker-teacher": {}, "ranker-late": {}},
                                                    "int8_bytes": {"ranker-teacher": 1, "ranker-late": 1}}))
    assert prune_rankers(system) == ["ranker-teacher"]  # every shipped config reads with ranker-late
    assert sorted(p.name for p in system.iterdir() if p.is_dir()) == ["labeler", "ranker", "ranker-late", "set-ranker"]
    info = json.loads((system / "export.json").read_text())
    assert info["pruned"] == ["ranker-teacher"] and set(info["int8_bytes"]) == {"ranker-late"}
    assert prune_rankers(system) == []  # nothing more to drop


def test_the_shipped_card_says_what_each_folder_is_and_what_reads_with_it():
    """The card export writes (and the recipe's reports keep the head of) lists the folders the system holds, the
    retriever and encoder its configs name, and each loop file's cross-fitted figures."""
    from effrag.training.export import FOLDERS, shipped_card

    system = Path(pretrained_path("efficientrag-all"))
    card = shipped_card(system, {"labeler": 22_926_640}, source="runs/x")
    held = [name for name in FOLDERS if (system / name).is_dir()]
    assert held == ["labeler", "filter", "ranker", "ranker-late", "set-ranker"]  # the teacher is not shipped
    for name in held:
        assert f"- `{name}/`: {FOLDERS[name]}" in card
    assert "`ranker-teacher/`" not in card and "(22.9 MB int8)" in card
    assert "every loop config reads with it" in card.split("- `ranker-late/`")[1].split("\n")[0]
    assert "**hybrid** retriever whose dense leg is **e5-small**" in card
    assert card.count("| `loop") == 6 and "| `loop-musique.json` | musique | 126 | 73.2 | 76.5 |" in card
