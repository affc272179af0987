"""A model folder's config.json and tokenizer are checked like its weights (issue #40 §4, §13).

A missing ``tokenizer.json`` used to load with transformers' fallback vocabulary (every word [UNK]), a
corrupted one or a ``config.json`` with another ``hidden_size`` gave errors that did not name the file.
Each fault is made for real on a saved tiny checkpoint (or a copy of the shipped one) and must be one
error naming the file, with the hashes recorded (new saves) and without them (older saves, ``verify="off"``).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from effrag.data import sample_path
from effrag.integrity import IntegrityError
from effrag.models import LabelerModel, load_model
from effrag.pretrained import pretrained_path


def _copy(src: Path, dst: Path, drop_records: bool = False) -> Path:
    shutil.copytree(src, dst)
    if drop_records:  # as saved before config.json and the tokenizer were recorded: weights only
        meta = json.loads((dst / "effrag_config.json").read_text())
        meta["files"] = {k: v for k, v in meta["files"].items() if k.endswith(".safetensors")}
        (dst / "effrag_config.json").write_text(json.dumps(meta))
    return dst


def _ff(path: Path, n: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) // 3
    data[start:start + n] = b"\xff" * min(n, len(data) - start)
    path.write_bytes(bytes(data))


def _hidden_size(path: Path, value: int) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg["hidden_size"] = value
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def test_save_records_config_and_tokenizer_files(tiny_efficientrag_dirs):
    d = tiny_efficientrag_dirs["labeler"]
    files = json.loads((d / "effrag_config.json").read_text())["files"]
    assert set(files) == {"model.safetensors", "heads.safetensors", "config.json", "tokenizer.json",
                          "tokenizer_config.json"}
    for name, rec in files.items():
        data = (d / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# the fault, what the error must say (regexes; with hashes recorded / without: an older checkpoint or verify="off")
FAULTS = {
    "tokenizer.json missing": (lambda d: (d / "tokenizer.json").unlink(),
                               r"tokenizer\.json: file of the checkpoint is missing",
                               r"tokenizer\.json: file of the checkpoint is missing"),
    "tokenizer.json 4 KB of 0xff": (lambda d: _ff(d / "tokenizer.json"),
                                    r"tokenizer\.json: content differs from what was saved",
                                    r"tokenizer\.json: corrupted tokenizer file"),
    "tokenizer_config.json missing": (lambda d: (d / "tokenizer_config.json").unlink(),
                                      r"tokenizer_config\.json: file of the checkpoint is missing",
                                      r"tokenizer_config\.json: file of the checkpoint is missing"),
    "config.json hidden_size": (lambda d: _hidden_size(d, 64),
                                r"config\.json: (content differs|size is \d+ bytes, but \d+ were saved)",
                                r"config\.json: does not fit the weights in model\.safetensors \(tensor \S+ is "
                                r"\[32\] there, \[64\] by config\.json\)"),
    "config.json not JSON": (lambda d: (d / "config.json").write_text("{not json"),
                             r"config\.json: size is",
                             r"config\.json: unusable encoder config"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("records", ["recorded", "not recorded"])
def test_a_missing_or_changed_tokenizer_or_config_is_one_error_naming_it(tiny_efficientrag_dirs, tmp_path, fault,
                                                                         records):
    make, with_hashes, without_hashes = FAULTS[fault]
    d = _copy(tiny_efficientrag_dirs["labeler"], tmp_path / "lab", drop_records=records == "not recorded")
    assert isinstance(load_model(d), LabelerModel)  # intact: loads
    make(d)
    expected = with_hashes if records == "recorded" else without_hashes
    with pytest.raises(IntegrityError) as e:
        load_model(d)
    assert re.fullmatch(rf"{re.escape(str(d))}/{expected}.*; re-download or re-train the checkpoint", str(e.value)), \
        str(e.value)
    with pytest.raises(IntegrityError, match=rf"^{re.escape(str(d))}/{without_hashes}"):
        load_model(d, verify="off")  # no hash check: the file's own check still names it


def test_shipped_model_records_its_tokenizer_and_refuses_a_copy_without_it(tmp_path):
    src = pretrained_path("efficientrag-all") / "labeler"
    files = json.loads((src / "effrag_config.json").read_text())["files"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.int8.safetensors"} <= set(files)
    load_model(src, verify="full")  # the records match the shipped bytes
    d = _copy(src, tmp_path / "labeler")
    (d / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match=rf"^{d}/tokenizer\.json: file of the checkpoint is missing"):
        load_model(d)


def test_cli_names_a_missing_tokenizer_in_one_line(tiny_efficientrag_dirs, tmp_path, capsys):
    from effrag.cli import main

    lab = _copy(tiny_efficientrag_dirs["labeler"], tmp_path / "lab")
    (lab / "tokenizer.json").unlink()
    dev = sample_path("hotpotqa", "dev")
    code = main(["eval", "--method", "efficientrag", "--labeler", str(lab), "--filter",
                 str(tiny_efficientrag_dirs["filter"]), "--questions", str(dev), "--corpus-from", str(dev),
                 "--retriever", "bm25", "--limit", "2", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"effrag: error: {lab}/tokenizer.json: file of the checkpoint is missing; "
                                 "re-download or re-train the checkpoint"]


@pytest.mark.parametrize("loader", ["model.name_or_path", "--llm hf:DIR"])
def test_a_folder_whose_only_weights_are_pytorch_model_bin_is_refused_before_it_is_opened(tmp_path, loader):
    """Issue #46, 5: effrag reads safetensors only; a pickle-based weight file is refused in one line naming it, before
    torch opens it (its restricted loader would not run code, but the rule is effrag's own)."""
    import torch
    from helpers import make_base
    from safetensors.torch import load_file

    folder = Path(make_base("electra" if loader == "model.name_or_path" else "llama", tmp_path / "base"))
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    with pytest.raises(IntegrityError, match=r"pytorch_model\.bin: effrag loads .* weights from safetensors files only"):
        if loader == "model.name_or_path":
            LabelerModel.from_encoder(str(folder))
        else:
            from effrag.llm import load_llm

            load_llm(f"hf:{folder}")
