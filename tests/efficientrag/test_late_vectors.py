"""A late-interaction ranker's chunk vectors on disk (effrag.models.late_vectors): a corpus is encoded once, a later
opening loads it and scores exactly as a fresh encoding; a killed index keeps its finished shards; a shard with
changed or missing bytes, or another model's, is refused by name and encoded again. Real tiny models, real files."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import hotpot_dev, tiny_bert_base

from effrag.models import LateRankerModel, late_vectors, load_model
from effrag.models.late_vectors import VectorStore, chunk_digest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def saved_late(tmp_path_factory):
    base = tiny_bert_base(tmp_path_factory.mktemp("late_base"), seed=5)
    torch.manual_seed(5)
    model = LateRankerModel.from_encoder(str(base), {"dim": 16, "max_length": 48, "query_max_length": 16})
    with torch.no_grad():
        model.log_scale.fill_(0.5)
    path = tmp_path_factory.mktemp("late") / "ranker-late"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chunks():
    return [tuple(p.text.split()) for q in hotpot_dev(6) for p in q.contexts[:5]]  # 30 chunks


def _rows_counter(model):
    rows = []
    hook = model.encoder.register_forward_hook(lambda m, args, kw, out: rows.append(kw["input_ids"].shape[0]),
                                               with_kwargs=True)
    return rows, hook


def test_a_second_opening_loads_every_vector_and_scores_exactly_as_encoding(saved_late, chunks, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 8)
    first = load_model(saved_late).eval()
    store = first.vector_store(tmp_path, bf16=False, max_length=None)
    assert first.index(chunks, batch_size=4, store=store) == {"loaded": 0, "encoded": len(set(chunks))}
    assert len(list(store.folder.glob("vectors-*.safetensors"))) == 4  # 30 chunks in shards of 8
    q = ["Which magazine was started first?"] * len(chunks)
    expected = first.predict(q, list(chunks))

    again = load_model(saved_late).eval()  # a new process's model: nothing in memory
    rows, hook = _rows_counter(again)
    try:
        store2 = again.vector_store(tmp_path, bf16=False, max_length=None)
        assert store2.folder == store.folder
        assert again.index(chunks, batch_size=4, store=store2) == {"loaded": 30, "encoded": 0} and rows == []
        for key in chunks:
            assert torch.equal(again.vectors_of(key), first.vectors_of(key))
        assert again.predict(q, list(chunks)) == expected  # exactly: the vectors are stored as computed
        assert sum(rows) == 1  # the query only
    finally:
        hook.remove()
    # another chunk length is another variant: its own folder, nothing loaded from this one
    other = again.vector_store(tmp_path, bf16=False, max_length=32)
    assert other.folder != store.folder and other.load([chunk_digest(c) for c in chunks]) == {}


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-variant"])
def test_a_damaged_shard_is_refused_by_name_and_its_chunks_encoded_again(saved_late, chunks, tmp_path, caplog,
                                                                        monkeypatch, damage):
    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 16)
    model = load_model(saved_late).eval()
    store = model.vector_store(tmp_path, bf16=False, max_length=None)
    model.index(chunks, batch_size=8, store=store)
    shards = sorted(store.folder.glob("vectors-*.safetensors"))
    assert len(shards) == 2
    victim = shards[0]
    data = bytearray(victim.read_bytes())
    if damage == "flip":  # one byte of the tensors' data
        data[-7] ^= 0x10
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a right shard of another model moved into this model's folder
        alien = VectorStore(tmp_path / "alien", {**store.variant, "weights": "0123456789abcdef"})
        moved = alien.add([chunk_digest(c) for c in chunks[:3]], [torch.zeros(2, 16)] * 3)
        moved.replace(victim)

    fresh = load_model(saved_late).eval()
    with caplog.at_level(logging.WARNING, logger="effrag.models.late_vectors"):
        made = fresh.index(chunks, batch_size=8, store=fresh.vector_store(tmp_path, bf16=False, max_length=None))
    assert victim.name in caplog.text and "encoded again" in caplog.text
    assert made["encoded"] > 0 and made["loaded"] + made["encoded"] == len(set(chunks))
    for key in chunks:  # every vector right: the damaged shard's chunks were encoded again, not read
        assert torch.equal(fresh.vectors_of(key), model.vectors_of(key))
    # and the store is whole again: a third opening loads all
    third = load_model(saved_late).eval()
    assert third.index(chunks, store=third.vector_store(tmp_path, bf16=False, max_length=None))["encoded"] == 0


def test_a_killed_index_keeps_its_finished_shards(saved_late, chunks, tmp_path):
    """A real SIGKILL after the second shard: the next index loads those 16 chunks and encodes only the rest."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import torch
        torch.set_num_threads(1)
        from effrag.models import load_model, late_vectors
        from helpers import hotpot_dev
        late_vectors.SHARD_CHUNKS = 8
        chunks = [tuple(p.text.split()) for q in hotpot_dev(6) for p in q.contexts[:5]]
        model = load_model({str(saved_late)!r}).eval()
        done = []
        def progress(n):
            done.append(n)
            if len(done) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        model.index(chunks, batch_size=4, store=model.vector_store({str(tmp_path)!r}, False, None), progress=progress)
    """)
    from pathlib import Path

    tests_dir = Path(__file__).parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=tests_dir, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tests_dir)})
    assert proc.returncode == -9, proc.stderr[-2000:]
    model = load_model(saved_late).eval()
    store = model.vector_store(tmp_path, bf16=False, max_length=None)
    assert len(list(store.folder.glob("vectors-*.safetensors"))) == 2
    assert not list(store.folder.glob("*.tmp*"))
    assert model.index(chunks, batch_size=4, store=store) == {"loaded": 16, "encoded": 14}


def test_an_int8_copy_keeps_its_own_vectors(saved_late, chunks):
    """int8_copy's model reads with int8 weights: it starts with no vectors (not the original's, and not a copy of
    a corpus's worth of them) and its stored ones are another variant."""
    from effrag.pipelines.efficientrag.models import int8_copy

    model = load_model(saved_late).eval()
    model.index(chunks[:4])
    q = int8_copy(model)
    assert len(model._vectors) == 4 and len(q._vectors) == 0
    assert q.vector_variant(False, None)["weights"] != model.vector_variant(False, None)["weights"]


def test_the_pipeline_encodes_a_corpus_at_its_first_opening_only(saved_late, tiny_efficientrag_dirs, tmp_path):
    """What `effrag eval`, `serve` and `retrieve` do: open the system over a corpus; a second opening loads every
    vector, and the loop's pools and scores are the first opening's, exactly."""
    from helpers import bm25_over

    from effrag.pipelines.efficientrag import EfficientRAGConfig
    from effrag.pipelines.efficientrag.pipeline import EfficientRAGPipeline

    questions = hotpot_dev(8)
    retriever = bm25_over(questions)
    config = EfficientRAGConfig(hop_k=4, first_hop_k=8, max_hops=2, tag_threshold=0.0, pool_source="seen",
                                pool_order="rank", labeler_top=2, rescore_top=4, bf16=False)
    d = tiny_efficientrag_dirs

    def opened():
        return EfficientRAGPipeline(retriever, labeler=d["labeler"], filter=d["filter"], ranker=saved_late,
                                    config=config, vector_store=tmp_path / "store")

    first = opened()
    assert first.prepared["passages"] == len(retriever.corpus) and first.prepared["vectors_loaded"] == 0
    assert first.prepared["vectors_encoded"] > 0
    again = opened()
    assert again.prepared["vectors_loaded"] == first.prepared["vectors_encoded"]
    assert again.prepared["vectors_encoded"] == 0
    api = EfficientRAGPipeline.from_pretrained(d["labeler"], d["filter"], retriever=retriever, ranker=saved_late,
                                               config=config, vector_store=tmp_path / "store")  # EfficientRAG's API
    assert api.prepared["vectors_loaded"] == first.prepared["vectors_encoded"]
    texts = [q.question for q in questions[:4]]
    for a, b in zip(first.loop.run(texts), again.loop.run(texts)):
        assert [c.id for c in a.chunks] == [c.id for c in b.chunks]
        assert [c.rank_score for c in a.chunks] == [c.rank_score for c in b.chunks]


def test_a_store_that_cannot_be_written_warns_once_and_the_index_still_serves(saved_late, chunks, tmp_path, caplog,
                                                                             monkeypatch):
    """The store's folder lies under a regular file (as a read-only or full disk would fail a write): one warning
    naming it, the vectors kept in memory, the scores those of no store at all."""
    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 8)
    (tmp_path / "blocker").write_text("a file, not a folder")
    model = load_model(saved_late).eval()
    store = model.vector_store(tmp_path / "blocker", bf16=False, max_length=None)
    with caplog.at_level(logging.WARNING, logger="effrag.models.late_vectors"):
        assert model.index(chunks, store=store)["encoded"] == len(set(chunks))
    assert caplog.text.count("cannot write") == 1 and "blocker" in caplog.text and store.unwritable
    plain = load_model(saved_late).eval()
    q = ["Who wrote it?"] * len(chunks)
    assert model.predict(q, list(chunks)) == plain.predict(q, list(chunks))


def test_prepare_makes_the_vectors_at_the_length_the_loop_reads_them(saved_late, tiny_efficientrag_dirs):
    """With labeler_max_length set and ranker_max_length not, the loop reads the ranker at the Labeler's length: the
    vectors prepare makes are those, so no question encodes a chunk."""
    from helpers import bm25_over

    from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop
    from effrag.pipelines.efficientrag.models import load_models

    d = tiny_efficientrag_dirs
    lab, fil, rank = load_models(d["labeler"], d["filter"], "cpu", ranker=saved_late)
    questions = hotpot_dev(6)
    config = EfficientRAGConfig(hop_k=4, first_hop_k=8, max_hops=2, tag_threshold=0.0, pool_source="seen",
                                pool_order="rank", labeler_top=2, rescore_top=4, labeler_max_length=32, bf16=False)
    loop = EfficientRAGLoop(lab, fil, bm25_over(questions), config, ranker=rank)
    assert loop.prepare()["vectors_encoded"] > 0
    encoded, original = [], rank._encode_chunks
    rank._encode_chunks = lambda keys, *a, **k: encoded.append(len(keys)) or original(keys, *a, **k)
    try:
        results = loop.run([q.question for q in questions])
    finally:
        del rank._encode_chunks
    assert encoded == [] and all(c.rank_score is not None for r in results for c in r.chunks)


def test_weights_changed_in_process_never_read_or_store_the_old_vectors(saved_late, chunks, tmp_path):
    """A late ranker trained (or given other weights) in the process that indexed a corpus: its vectors in memory
    and its store folder were the old weights'. Training mode and load_state_dict drop them, so the next index
    encodes with the new weights into the new weights' folder, and scores as a fresh model with those weights."""
    model = load_model(saved_late).eval()
    old = model.vector_store(tmp_path, bf16=False, max_length=None)
    model.index(chunks[:8], batch_size=4, store=old)
    q = ["Which magazine was started first?"] * 8
    model.train()  # a training step in process
    with torch.no_grad():
        model.proj.weight.mul_(-1.0)
    model.eval()
    assert len(model._vectors) == 0
    new = model.vector_store(tmp_path, bf16=False, max_length=None)
    assert new.folder != old.folder
    assert model.index(chunks[:8], batch_size=4, store=new) == {"loaded": 0, "encoded": 8}
    fresh = load_model(saved_late).eval()
    fresh.load_state_dict(model.state_dict())
    assert fresh.predict(q, list(chunks[:8])) == pytest.approx(model.predict(q, list(chunks[:8])), abs=1e-5)
    reloaded = load_model(saved_late).eval()
    reloaded.index(chunks[:8], batch_size=4, store=old)
    assert len(reloaded._vectors) == 8
    reloaded.load_state_dict(model.state_dict())  # other weights given to a model that had indexed
    # the same folder although the two tokenizers last read other inputs (their truncation settings are not hashed)
    assert len(reloaded._vectors) == 0 and reloaded.vector_store(tmp_path, bf16=False, max_length=None).folder == new.folder


def test_the_store_keeps_within_its_cap_by_dropping_the_least_recently_used_shards(saved_late, chunks, tmp_path,
                                                                                   monkeypatch, caplog):
    """EFFRAG_LATE_VECTORS_MAX_GB caps the whole store: after an index, the shards last used longest ago go (a read
    counts as a use), never one the index read or wrote, and a folder left empty goes too; 0 never prunes."""
    import os
    import time

    monkeypatch.setattr(late_vectors, "SHARD_CHUNKS", 8)
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "0")
    a = load_model(saved_late).eval()
    store_a = a.vector_store(tmp_path, bf16=False, max_length=None)
    a.index(chunks[:16], batch_size=4, store=store_a)
    shards = sorted(store_a.folder.glob("vectors-*.safetensors"))
    assert len(shards) == 2
    now = time.time()
    for age, path in zip((200, 100), shards):  # shards[0] the older
        os.utime(path, (now - age, now - age))
    reader = load_model(saved_late).eval()  # a later opening reads one shard's chunks: that shard's use is now
    assert reader.index(chunks[:8], batch_size=4, store=reader.vector_store(tmp_path, bf16=False, max_length=None)
                        )["loaded"] == len(set(chunks[:8]))
    (unread,) = [p for p in shards if os.path.getmtime(p) < now - 50]  # the shard no opening read since
    (read,) = [p for p in shards if p != unread]

    other = load_model(saved_late).eval()  # another variant (another chunk length): its own folder
    store_b = other.vector_store(tmp_path, bf16=False, max_length=32)
    assert store_b.folder != store_a.folder
    other.index(chunks[16:24], batch_size=4, max_length=32, store=store_b)  # 0: nothing pruned
    assert unread.exists() and read.exists()
    (new,) = store_b.folder.glob("vectors-*.safetensors")
    cap = new.stat().st_size + read.stat().st_size + 64  # room for the new shard and one of the older two
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, repr(cap / 1e9))
    with caplog.at_level(logging.INFO, logger="effrag.models.late_vectors"):
        again = load_model(saved_late).eval()
        assert again.index(chunks[16:24], batch_size=4, max_length=32,
                           store=again.vector_store(tmp_path, bf16=False, max_length=32))["loaded"] == len(set(chunks[16:24]))
    assert not unread.exists() and read.exists() and new.exists()
    assert "removed the 1 least recently used shards" in caplog.text

    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "1e-12")  # below what this index needs: its own shards stay
    last = load_model(saved_late).eval()
    assert last.index(chunks[16:24], batch_size=4, max_length=32,
                      store=last.vector_store(tmp_path, bf16=False, max_length=32))["loaded"] == len(set(chunks[16:24]))
    assert new.exists() and not store_a.folder.exists()  # the other variant's last shard went, and its empty folder

    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "lots")  # one line naming the variable (test_late_vectors_faults.py)
    with pytest.raises(ValueError, match="EFFRAG_LATE_VECTORS_MAX_GB='lots': expected a finite number of GB >= 0"):
        late_vectors.max_store_bytes()
