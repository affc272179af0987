"""A million passages at the same cost (issue #68): a late ranker's codec (product-quantised vectors, checked at load),
on-demand reads of a store's memory-mapped shards with a check per chunk, no cliff past PREPARED_CHUNKS (the questions
read the store instead of encoding), and an index built with its system's vectors (`effrag index build --system`),
which the system opened over it reads and never prunes. Real tiny models, real files."""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from helpers import bm25_over, hotpot_dev, tiny_bert_base

from effrag.models import LateRankerModel, late_vectors, load_model
from effrag.models.late_codec import CODEC_NAME, ProductQuantizer
from effrag.models.late_vectors import VectorStore, chunk_digest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def late_dirs(tmp_path_factory):
    """A tiny late ranker saved twice: as trained, and with a codec fitted on its own chunk vectors."""
    base = tiny_bert_base(tmp_path_factory.mktemp("late_base"), seed=7)
    torch.manual_seed(7)
    model = LateRankerModel.from_encoder(str(base), {"dim": 16, "max_length": 48, "query_max_length": 16})
    with torch.no_grad():
        model.log_scale.fill_(0.5)
    root = tmp_path_factory.mktemp("late")
    plain, coded = root / "plain", root / "coded"
    model.save_pretrained(plain)
    shutil.copytree(plain, coded)
    texts = [" ".join(p.text.split()) for q in hotpot_dev(12) for p in q.contexts]
    vecs = torch.cat(model.eval()._encode_all(texts, 48, 8, False))
    load_model(coded).attach_codec(coded, ProductQuantizer.train(vecs, subspaces=4), {"test": True})
    return {"plain": plain, "coded": coded}


@pytest.fixture(scope="module")
def chunks():
    return [tuple(p.text.split()) for q in hotpot_dev(6) for p in q.contexts[:5]]  # 30 chunks


def test_a_codec_keeps_a_sixteenth_of_the_bytes_and_scores_alike_from_store_or_fresh(late_dirs, chunks, tmp_path):
    coded, plain = load_model(late_dirs["coded"]).eval(), load_model(late_dirs["plain"]).eval()
    assert coded.codec is not None and plain.codec is None
    store = coded.vector_store(tmp_path, bf16=False, max_length=None)
    assert store.folder != plain.vector_store(tmp_path, bf16=False, max_length=None).folder  # the codec's variant
    assert coded.index(chunks, batch_size=8, store=store) == {"loaded": 0, "encoded": len(set(chunks))}
    found = VectorStore(store.folder, store.variant).load([chunk_digest(c) for c in chunks])
    assert len(found) == len(set(chunks))
    for codes in found.values():  # 4 bytes a token, against 16 fp32 dims (64 bytes)
        assert codes.dtype == torch.uint8 and codes.shape[1] == 4
    q = ["Which magazine was started first?"] * len(chunks)
    fresh = coded.predict(q, list(chunks))
    again = load_model(late_dirs["coded"]).eval()
    assert again.index(chunks, store=again.vector_store(tmp_path, bf16=False, max_length=None))["encoded"] == 0
    assert again.predict(q, list(chunks)) == fresh  # codes from the store decode as freshly made ones
    exact = plain.predict(q, list(chunks))
    corr = torch.corrcoef(torch.tensor([fresh, exact]))[0, 1]
    assert corr > 0.9, corr  # close to the vectors as computed, and not them
    assert fresh != exact


def test_a_codec_with_changed_bytes_is_refused_naming_it(late_dirs, tmp_path, monkeypatch):
    folder = tmp_path / "coded"
    shutil.copytree(late_dirs["coded"], folder)
    data = bytearray((folder / CODEC_NAME).read_bytes())
    data[-3] ^= 0x01
    (folder / CODEC_NAME).write_bytes(bytes(data))
    monkeypatch.setenv("EFFRAG_VERIFY", "full")
    with pytest.raises(Exception, match=CODEC_NAME):
        load_model(folder)
    monkeypatch.setenv("EFFRAG_VERIFY", "off")  # unchecked by the checkpoint: the codec's own hash still refuses it
    with pytest.raises(ValueError, match=CODEC_NAME):
        load_model(folder)
    monkeypatch.setenv("EFFRAG_LATE_CODEC", "0")  # left out on request: the vectors as computed
    assert load_model(folder).codec is None
    monkeypatch.setenv("EFFRAG_LATE_CODEC", "maybe")
    with pytest.raises(ValueError, match="EFFRAG_LATE_CODEC"):
        load_model(folder)


def test_a_chunk_whose_stored_bytes_changed_is_never_read(late_dirs, chunks, tmp_path, caplog, monkeypatch):
    """One byte of one chunk's codes flipped in place: the header checks pass, the chunk's own check does not; the
    shard is refused whole (nothing read from it used) and its chunks encoded again, exactly as before."""
    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 16)
    model = load_model(late_dirs["coded"]).eval()
    store = model.vector_store(tmp_path, bf16=False, max_length=None)
    model.index(chunks, batch_size=8, store=store)
    victim = sorted(store.folder.glob("vectors-*.safetensors"))[0]
    data = bytearray(victim.read_bytes())
    header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
    start = 8 + int.from_bytes(data[:8], "little") + header["payload"]["data_offsets"][0]
    data[start + 5] ^= 0x40
    victim.write_bytes(bytes(data))
    fresh = load_model(late_dirs["coded"]).eval()
    with caplog.at_level(logging.WARNING, logger="effrag.models.late_vectors"):
        made = fresh.index(chunks, batch_size=8, store=fresh.vector_store(tmp_path, bf16=False, max_length=None))
    assert victim.name in caplog.text and "check recorded" in caplog.text
    assert victim.read_bytes() != bytes(data)  # removed, and its chunks written again whole (the same name)
    assert made["encoded"] == 16 and made["loaded"] == len(set(chunks)) - 16
    for key in chunks:
        assert torch.equal(fresh.vectors_of(key), model.vectors_of(key))


def test_a_store_of_the_older_format_is_refused_and_encoded_again(late_dirs, chunks, tmp_path, caplog):
    from safetensors.torch import save_file

    model = load_model(late_dirs["plain"]).eval()
    store = model.vector_store(tmp_path, bf16=False, max_length=None)
    store.folder.mkdir(parents=True)
    old = store.folder / "vectors-0123456789abcdef.safetensors"  # format 1: whole-shard hash, "vectors" tensor
    save_file({"digests": torch.zeros(1, 16, dtype=torch.uint8), "offsets": torch.tensor([0, 2]),
               "vectors": torch.zeros(2, 16)}, str(old),
              metadata={"format": "effrag-late-vectors/1", "variant": json.dumps(store.variant, sort_keys=True)})
    with caplog.at_level(logging.WARNING, logger="effrag.models.late_vectors"):
        assert model.index(chunks[:4], store=store)["encoded"] == len(set(chunks[:4]))
    assert old.name in caplog.text and "another model variant or format" in caplog.text and not old.exists()


def _system(tmp_path, tiny_efficientrag_dirs, late_dir):
    """A system folder: the tiny Labeler and Filter, the coded late ranker, one loop.json that reads with it."""
    root = tmp_path / "system"
    for name, src in (("labeler", tiny_efficientrag_dirs["labeler"]), ("filter", tiny_efficientrag_dirs["filter"]),
                      ("ranker-late", late_dir)):
        shutil.copytree(src, root / name)
    config = {"hop_k": 4, "first_hop_k": 8, "max_hops": 2, "tag_threshold": 0.0, "pool_source": "seen",
              "pool_order": "rank", "labeler_top": 2, "rescore_top": 4, "bf16": False}
    (root / "loop.json").write_text(json.dumps({"config": config, "retriever": "bm25", "ranker": "ranker-late"}))
    return root


def test_past_the_cap_the_questions_read_the_index_s_vectors_and_encode_nothing(late_dirs, tiny_efficientrag_dirs,
                                                                               tmp_path, monkeypatch):
    """`effrag index build --system` then the system opened over the index with a corpus past PREPARED_CHUNKS:
    nothing is prepared or encoded at opening or by any question (every chunk read comes from the index's store),
    and the results are exactly those of the same corpus prepared whole under the cap."""
    import effrag.pipelines.efficientrag.loop as loop_module
    from effrag.cli import main
    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline
    from effrag.setup import open_index

    system = _system(tmp_path, tiny_efficientrag_dirs, late_dirs["coded"])
    questions = hotpot_dev(8)
    corpus = tmp_path / "corpus.jsonl"
    passages = bm25_over(questions).corpus
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 16)
    main(["index", "build", "--corpus", str(corpus), "--retriever", "bm25", "--output", str(tmp_path / "idx"),
          "--system", str(system)])
    stored = tmp_path / "idx" / "late-vectors"
    assert (stored / late_vectors.KEEP_MARKER).is_file()
    (folder,) = [p for p in stored.iterdir() if p.is_dir()]
    shards = sorted(folder.glob("vectors-*.safetensors"))
    assert len(shards) == -(-len(passages) // 16)
    # a second run (after a kill, say) finds every part stored and encodes nothing
    main(["index", "vectors", "--index", str(tmp_path / "idx"), "--system", str(system)])
    assert sorted(folder.glob("vectors-*.safetensors")) == shards

    texts = [q.question for q in questions[:4]]
    under = EfficientRAGPipeline(open_index(tmp_path / "idx"), model=system, vector_store=tmp_path / "elsewhere")
    assert under.prepared["passages"] == len(passages)
    expected = under.loop.run(texts)

    monkeypatch.setattr(loop_module, "PREPARED_CHUNKS", len(passages) - 1)
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "1e-12")  # the cache's cap: an index's store is never pruned
    over = EfficientRAGPipeline(open_index(tmp_path / "idx"), model=system)
    assert over.prepared["passages"] == 0 and over.prepared["vectors_stored"] == len(passages)
    rank = over.loop._model(over.loop.ranker)
    encoded, original = [], rank._encode_chunks
    rank._encode_chunks = lambda keys, *a, **k: encoded.append(len(keys)) or original(keys, *a, **k)
    results = over.loop.run(texts)
    assert encoded == []  # every chunk a question read came from the index's store
    assert len(rank._vectors) > 0
    for a, b in zip(expected, results):
        assert [c.id for c in a.chunks] == [c.id for c in b.chunks]
        assert [c.rank_score for c in a.chunks] == [c.rank_score for c in b.chunks]
    assert sorted(folder.glob("vectors-*.safetensors")) == shards


def test_ranker_codec_fits_and_records_a_codec_the_checkpoint_then_loads(late_dirs, tmp_path, capsys):
    """`effrag ranker-codec` on a saved late ranker: the codec is written into the folder, recorded among its files
    with its provenance, and loaded with the checkpoint; on another model type it is one line naming the folder."""
    from effrag.cli import main
    from effrag.data import sample_path
    from effrag.models.model_files import read_effrag_config

    folder = tmp_path / "late"
    shutil.copytree(late_dirs["plain"], folder)
    main(["ranker-codec", "--model", str(folder), "--inputs", str(sample_path("hotpotqa", "dev")), "--chunks", "16",
          "--subspaces", "4", "--no-bf16"])
    assert "4 bytes a token" in capsys.readouterr().out
    assert CODEC_NAME in read_effrag_config(folder)["files"]
    model = load_model(folder)
    assert model.codec is not None and model.codec.bytes_per_token == 4
    from effrag.models.late_codec import ProductQuantizer

    prov = ProductQuantizer.recorded_provenance(folder / CODEC_NAME)
    assert prov["chunks"] == 16 and prov["subspaces"] == 4 and "ranker-codec" in prov["command"]
    assert not any(str(tmp_path) in v for v in prov["inputs"])  # no machine path in a shipped file
    # a rerun as asked keeps it (the recipe resumes; a bf16 refit is not bit-identical), other options refit it
    sha = model.codec.sha256
    main(["ranker-codec", "--model", str(folder), "--inputs", str(sample_path("hotpotqa", "dev")), "--chunks", "16",
          "--subspaces", "4", "--no-bf16"])
    assert "kept (fitted as asked before)" in capsys.readouterr().out and load_model(folder).codec.sha256 == sha
    # the same codec saved again is the same bytes (one metadata key: safetensors orders several per process)
    before = (folder / CODEC_NAME).read_bytes()
    ProductQuantizer.load(folder / CODEC_NAME).save(folder, prov)
    assert (folder / CODEC_NAME).read_bytes() == before
    main(["ranker-codec", "--model", str(folder), "--inputs", str(sample_path("hotpotqa", "dev")), "--chunks", "16",
          "--subspaces", "8", "--no-bf16"])
    assert "8 bytes a token" in capsys.readouterr().out and load_model(folder).codec.bytes_per_token == 8
