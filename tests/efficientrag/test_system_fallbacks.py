"""No silent fallback with ``--model DIR`` (issue #46, 7): a loop config naming an unknown retriever is refused in one
line; a system without any loop config, and an index whose retriever is not the one the config was tuned over,
are said on stderr. Real tiny models and BM25 / dense over the bundled sample."""
from __future__ import annotations

import json
import shutil

from helpers import run_cli

from effrag.data import sample_path

DEV = sample_path("hotpotqa", "dev")


def _system(dirs, root, loop: dict | None):
    for name in ("labeler", "filter"):
        shutil.copytree(dirs[name], root / name)
    if loop is not None:
        (root / "loop.json").write_text(json.dumps(loop))
    return root


def _eval(system, tmp_path, capsys, *extra):
    return run_cli(["eval", "--method", "efficientrag", "--model", system, "--questions", DEV, "--corpus-from", DEV,
                    "--limit", "2", "--cache-dir", tmp_path / "idx", "--output", tmp_path / "out", *extra], capsys)


def test_a_loop_config_naming_an_unknown_retriever_is_one_line(tiny_efficientrag_dirs, tmp_path, capsys):
    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "hybird"})
    code, out, err = _eval(system, tmp_path, capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"effrag: error: {system / 'loop.json'}: field 'retriever': unknown retriever 'hybird'; expected one of "
        "dense, bm25, hybrid, milvus"]


def test_a_system_without_a_loop_config_says_it_runs_on_defaults(tiny_efficientrag_dirs, tmp_path, capsys, caplog):
    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", None)
    code, _, _ = _eval(system, tmp_path, capsys, "--retriever", "bm25", "--max-hops", "2", "--hop-k", "3")
    assert code == 0
    assert any("has no loop.json" in r.getMessage() and "library's default options" in r.getMessage()
               for r in caplog.records)


def test_a_retriever_other_than_the_tuned_one_is_said(tiny_efficientrag_dirs, tmp_path, capsys):
    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "hybrid"})
    code, _, err = _eval(system, tmp_path, capsys, "--retriever", "bm25")
    assert code == 0
    assert "effrag: warning: the efficientrag loop config was tuned over a hybrid retriever; this run uses bm25" in err
    code, _, err = _eval(system, tmp_path, capsys, "--overwrite")  # the tuned one: nothing to say
    assert code == 0 and "was tuned over" not in err


def test_a_loop_config_names_its_encoder_by_alias_and_a_bad_one_is_one_line(tiny_efficientrag_dirs, tmp_path, capsys):
    """The shipped configs were tuned over an e5-small hybrid and say so (``"encoder"``); a typo or a machine path
    there is refused in one line before any index is built; a config that names none keeps the default."""
    from effrag.pipelines.efficientrag.system import config_encoder, open_system
    from effrag.pretrained import pretrained_path

    shipped = pretrained_path("efficientrag-all")
    for name in ("loop.json", "loop-hotpotqa.json", "loop-2wikimqa.json", "loop-musique.json"):
        assert config_encoder(shipped / name) == "e5-small"
    assert open_system("efficientrag-all", dataset="musique").encoder == "e5-small"
    assert config_encoder({"config": {}, "retriever": "hybrid"}) is None
    for bad in ("e5-smal", "/models/e5"):
        system = _system(tiny_efficientrag_dirs, tmp_path / f"sys-{len(bad)}", {
            "config": {"hop_k": 3, "max_hops": 2}, "retriever": "bm25", "encoder": bad})
        code, _, err = _eval(system, tmp_path, capsys)
        assert code == 2 and err.strip().splitlines() == [
            f"effrag: error: {system / 'loop.json'}: field 'encoder': {bad!r} is not a packaged encoder alias; "
            "expected one of minilm, e5-small, smollm2"]


def test_an_index_of_another_encoder_than_the_tuned_one_is_said(tiny_efficientrag_dirs, tmp_path, capsys):
    """A config tuned over e5-small run over a MiniLM dense index: the run goes on, and stderr says why its figures
    are not the config's."""
    from effrag.data import build_corpus
    from effrag.retrieval import build_retriever
    from effrag.setup import encoder_mismatch

    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "dense", "encoder": "e5-small"})
    build_retriever("dense", build_corpus([DEV]), encoder="minilm", show_progress=False).save(tmp_path / "minilm")
    code, _, err = _eval(system, tmp_path, capsys, "--index", tmp_path / "minilm")
    assert code == 0
    assert ("effrag: warning: efficientrag's loop config was tuned over the e5-small encoder; this run's dense "
            "retrieval uses minilm, whose candidates it was not tuned on (give --encoder e5-small, or an index built "
            "with it)") in err
    minilm = build_retriever("dense", build_corpus([DEV]), encoder="minilm", show_progress=False)
    assert encoder_mismatch("minilm", minilm) is None and encoder_mismatch(None, minilm) is None


def test_a_loop_config_reads_with_the_ranker_folder_it_names(tiny_efficientrag_dirs, tmp_path, capsys):
    """A system with two rankers (ranker/ the student, ranker-teacher/ the teacher): each loop config file opens the
    one it was tuned with; a name the system lacks, or one that would leave the folder, is one line."""
    from effrag.pipelines.efficientrag.system import open_system

    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "bm25"})
    shutil.copytree(tiny_efficientrag_dirs["ranker"], system / "ranker-teacher")  # and no ranker/
    (system / "loop-hotpotqa.json").write_text(json.dumps({"config": {"hop_k": 3, "max_hops": 2, "pool_order": "rank"},
                                                           "retriever": "bm25", "ranker": "ranker-teacher"}))
    assert open_system(system).ranker is None
    assert open_system(system, dataset="hotpotqa").ranker == system / "ranker-teacher"
    code, _, err = _eval(system, tmp_path, capsys, "--er-config", system / "loop-hotpotqa.json")  # ranks with the teacher
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    read = [c for r in rows for e in r["trace"]["hops"] for c in e["chunks"]]
    assert len(rows) == 2 and read and all(c.get("rank_score") is not None for c in read)  # the teacher read them
    shutil.copytree(tiny_efficientrag_dirs["ranker"], system / "ranker")
    assert open_system(system).ranker == system / "ranker"
    for bad, message in (("ranker-student", "names ranker-student/, which"), ("../ranker", "is not a ranker folder")):
        (system / "loop-hotpotqa.json").write_text(json.dumps({"config": {"hop_k": 3}, "retriever": "bm25",
                                                               "ranker": bad}))
        code, _, err = _eval(system, tmp_path, capsys, "--er-config", system / "loop-hotpotqa.json")
        lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
        assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_eval_runs_the_systems_config_for_the_questions_dataset(tiny_efficientrag_dirs, tmp_path, capsys):
    """``effrag eval --model DIR`` on HotpotQA questions runs the system's loop-hotpotqa.json (what its tables report
    for HotpotQA), says which file on stderr, and records its options; --er-config still chooses any file."""
    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "bm25"})
    (system / "loop-hotpotqa.json").write_text(json.dumps({"config": {"hop_k": 2, "max_hops": 1},
                                                           "retriever": "dense"}))
    code, _, err = _eval(system, tmp_path, capsys, "--retriever", "bm25")
    assert code == 0, err
    assert f"effrag: efficientrag loop config: {system / 'loop-hotpotqa.json'}" in err
    # the file that runs was tuned over dense: said, as for any retriever other than the tuned one
    assert "the efficientrag loop config was tuned over a dense retriever; this run uses bm25" in err
    recorded = json.loads((tmp_path / "out" / "config.json").read_text())["run"]["method_config"]
    assert (recorded["hop_k"], recorded["max_hops"]) == (2, 1)
    code, _, err = _eval(system, tmp_path, capsys, "--er-config", system / "loop.json", "--overwrite")
    assert code == 0, err
    assert f"effrag: efficientrag loop config: {system / 'loop.json'}" in err
    recorded = json.loads((tmp_path / "out" / "config.json").read_text())["run"]["method_config"]
    assert (recorded["hop_k"], recorded["max_hops"]) == (3, 2)


def test_a_model_folder_linked_from_outside_the_system_is_refused_in_one_line(tiny_efficientrag_dirs, tmp_path,
                                                                             capsys):
    """Issue #69, 6a: a ``ranker-<name>`` symbolic link inside a system folder was followed to weights outside it,
    which whoever copies or checks the folder does not see. A link resolving outside the system is refused, naming
    it; one that stays inside (``ranker`` -> ``ranker-teacher``) is fine."""
    import pytest

    from effrag.pipelines.efficientrag.system import open_system

    system = _system(tiny_efficientrag_dirs, tmp_path / "sys", {"config": {"hop_k": 3, "max_hops": 2},
                                                                 "retriever": "bm25", "ranker": "ranker-teacher"})
    outside = shutil.copytree(tiny_efficientrag_dirs["ranker"], tmp_path / "elsewhere")
    (system / "ranker-teacher").symlink_to(outside, target_is_directory=True)
    code, _, err = _eval(system, tmp_path, capsys)
    lines = [x for x in err.splitlines() if x.startswith("effrag: error:")]
    assert code == 2 and "Traceback" not in err and lines == [
        f"effrag: error: {system / 'ranker-teacher'}: a symbolic link to {outside.resolve()}, outside the system "
        f"folder {system}; a system's models must be inside it (copy them in instead of linking them)"]
    (system / "ranker-teacher").unlink()
    shutil.copytree(outside, system / "ranker-teacher")
    (system / "ranker-teacher" / "heads.safetensors").unlink()  # one file of it linked out: refused too
    (system / "ranker-teacher" / "heads.safetensors").symlink_to(outside / "heads.safetensors")
    with pytest.raises(ValueError, match=r"ranker-teacher/heads\.safetensors: a symbolic link to .*outside the system"):
        open_system(system)
    (system / "ranker-teacher" / "heads.safetensors").unlink()
    shutil.copy(outside / "heads.safetensors", system / "ranker-teacher")
    (system / "ranker").symlink_to("ranker-teacher", target_is_directory=True)  # inside: fine
    (system / "loop.json").write_text(json.dumps({"config": {"hop_k": 3, "max_hops": 2}, "retriever": "bm25"}))
    assert open_system(system).ranker == system / "ranker"
