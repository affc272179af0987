"""A damaged dense encoder is refused in one line naming the file, never a silently wrong ranking (issue #46, 1 and
5): real MiniLM-L6 weights copied from the installed package, then real damaged bytes.

4 KB of 0xff inside a layer (the issue's probe) is NaN as float32: caught by the NaN/Inf check even on first use;
damage that stays finite is caught by the sha256 recorded when effrag first read the folder.
"""
from __future__ import annotations

import shutil

import pytest
from helpers import run_cli

from effrag.integrity import CorruptFileError, IntegrityError, NonFiniteWeightsError
from effrag.retrieval.encoder import Encoder, check_encoder_weights, default_encoder_path


@pytest.fixture
def encoder_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "encoder"
    shutil.copytree(default_encoder_path(), d)
    return d


def _layer_offset(folder, name="encoder.layer.3.intermediate.dense.weight") -> int:
    """Byte offset of a tensor's data in model.safetensors (header: 8-byte length, then JSON)."""
    import json
    import struct

    raw = (folder / "model.safetensors").read_bytes()[:8]
    (n,) = struct.unpack("<Q", raw)
    header = json.loads((folder / "model.safetensors").read_bytes()[8: 8 + n])
    key = next(k for k in header if k.endswith(name))
    return 8 + n + header[key]["data_offsets"][0] + 4096


def _write(folder, offset: int, data: bytes) -> None:
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_nan_bytes_inside_a_layer_are_refused_even_on_first_use(encoder_copy):
    _write(encoder_copy, _layer_offset(encoder_copy), b"\xff" * 4096)
    with pytest.raises(NonFiniteWeightsError, match=r"encoder .*encoder: tensor .*NaN/Inf"):
        Encoder(encoder_copy).encode(["a question"])


def test_finite_damage_after_first_use_is_a_hash_mismatch(encoder_copy):
    assert Encoder(encoder_copy).encode(["a question"]).shape == (1, 384)  # first use records the sha256
    _write(encoder_copy, _layer_offset(encoder_copy), b"\x00" * 4096)  # zeros: finite, silently wrong otherwise
    with pytest.raises(IntegrityError, match=r"model\.safetensors: the encoder's weights differ .*sha256 mismatch"):
        Encoder(encoder_copy).encode(["a question"])


def test_a_damaged_header_and_pickle_only_weights_are_one_line_errors(encoder_copy, tmp_path):
    _write(encoder_copy, 8, b"\xff" * 64)
    with pytest.raises(CorruptFileError, match=r"model\.safetensors: the encoder's safetensors header"):
        check_encoder_weights(encoder_copy)
    (encoder_copy / "model.safetensors").rename(encoder_copy / "pytorch_model.bin")
    with pytest.raises(IntegrityError, match=r"pytorch_model\.bin: effrag loads encoder weights from safetensors"):
        Encoder(encoder_copy).encode(["q"])


def test_effrag_eval_with_a_damaged_encoder_exits_with_one_line(encoder_copy, tmp_path, capsys):
    from effrag.data import sample_path

    _write(encoder_copy, _layer_offset(encoder_copy), b"\xff" * 4096)
    dev = sample_path("hotpotqa", "dev")
    code, out, err = run_cli(["eval", "--method", "direct-r", "--retriever", "dense", "--encoder", encoder_copy,
                              "--questions", dev, "--corpus-from", dev, "--limit", "2",
                              "--cache-dir", tmp_path / "idx", "--output", tmp_path / "out"], capsys)
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("effrag: error:")]
    assert len(errors) == 1 and "NaN/Inf" in errors[0] and str(encoder_copy) in errors[0]
    assert not (tmp_path / "out" / "metrics.json").exists()
