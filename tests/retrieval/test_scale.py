"""Scale-out (issue #15) on real passages of the bundled sample with the real MiniLM encoder:
resumable sharded encoding (killed and resumed), two gloo processes = one process, FAISS IVF/IVF-PQ/HNSW
trained on a sample, BM25 memory-mapped, Milvus Lite = FAISS flat, and FAISS GPU sharding (skipped
without a FAISS GPU build and a GPU)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from effrag.cli import main as cli_main
from effrag.data import Corpus, sample_path
from effrag.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Encoder,
    ShardedEmbeddings,
    build_retriever,
    encode_shards,
    load_retriever,
)

N_PASSAGES, SHARD = 80, 8
N_SHARDS = N_PASSAGES // SHARD
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(sample_corpus):
    return Corpus(sample_corpus.passages[:N_PASSAGES])


@pytest.fixture(scope="module")
def corpus_file(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "corpus.jsonl"
    corpus.save(path)
    return path


@pytest.fixture(scope="module")
def encoder():
    return Encoder()


@pytest.fixture(scope="module")
def store(corpus, encoder, tmp_path_factory):
    """The reference: one process, uninterrupted."""
    d = tmp_path_factory.mktemp("ref") / "emb_shards"
    stats = encode_shards(encoder, corpus.passages, d, shard_size=SHARD, show_progress=False,
                          corpus_fingerprint=corpus.fingerprint())
    assert stats["encoded"] == list(range(N_SHARDS)) and not stats["reused"]
    return d


@pytest.fixture(scope="module")
def queries(sample_dev_questions):
    return [q.question for q in sample_dev_questions[:40]]


def _ids_scores(results):
    return [[h.id for h in hits] for hits in results], np.array([[h.score for h in hits] for hits in results])


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **extra}


def _cli(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "effrag.cli", *args], env=env or _env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_sharded_embeddings_read_like_one_array(store):
    emb = ShardedEmbeddings(store)
    full = np.concatenate([np.load(store / f"emb_{i:05d}.npy") for i in range(N_SHARDS)])
    assert emb.shape == full.shape == (N_PASSAGES, 384)
    np.testing.assert_array_equal(emb[7:33], full[7:33])
    np.testing.assert_array_equal(emb[np.array([0, 7, 8, 79])], full[[0, 7, 8, 79]])
    np.testing.assert_array_equal(np.asarray(emb), full)


@pytest.mark.slow
def test_a_killed_encode_resumes_at_the_last_finished_shard(tmp_path, corpus_file, store, capsys):
    out = tmp_path / "idx"
    proc = _cli("index", "encode", "--corpus", str(corpus_file), "--output", str(out), "--shard-size", str(SHARD))
    deadline = time.time() + 120
    while len(list((out / "emb_shards").glob("emb_*.npy"))) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(list((out / "emb_shards").glob("emb_*.npy")))
    assert 2 <= finished < N_SHARDS, "the encode was not killed mid-way"
    assert cli_main(["index", "encode", "--corpus", str(corpus_file), "--output", str(out),
                     "--shard-size", str(SHARD)]) == 0
    line = capsys.readouterr().out
    kept = int(line.split("kept ")[1].split()[0])
    assert kept >= finished - 1 and f"encoded {N_SHARDS - kept}," in line  # only the missing ones
    np.testing.assert_allclose(np.asarray(ShardedEmbeddings(out / "emb_shards")), np.asarray(ShardedEmbeddings(store)),
                               atol=1e-5)
    # `index build` reads the finished shards instead of encoding, then removes them
    assert cli_main(["index", "build", "--corpus", str(corpus_file), "--retriever", "dense", "--output", str(out),
                     "--shard-size", str(SHARD)]) == 0
    assert (out / "index_meta.json").is_file() and not (out / "emb_shards").exists()


@pytest.mark.slow
def test_a_killed_index_build_resumes_from_its_finished_shards(tmp_path, corpus_file, corpus):
    """Issue #46, 6: `effrag index build --retriever dense` killed for real after some shards resumes from them (it
    used to encode in memory and start from zero). Proof of reuse: a finished shard is replaced by zeros of its shape
    before the rerun, and the saved index holds those zeros."""
    import faiss

    out = tmp_path / "idx"
    build = ["index", "build", "--corpus", str(corpus_file), "--retriever", "dense", "--output", str(out),
             "--shard-size", str(SHARD)]
    proc = _cli(*build)
    deadline = time.time() + 120
    while len(list((out / "emb_shards").glob("emb_*.npy"))) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted((out / "emb_shards").glob("emb_*.npy"))
    assert 2 <= len(finished) < N_SHARDS, "the build was not killed mid-way"
    np.save(finished[0], np.zeros((SHARD, 384), dtype=np.float32))
    assert cli_main(build) == 0
    assert (out / "index_meta.json").is_file() and not (out / "emb_shards").exists()
    index = faiss.read_index(str(out / "index.faiss"))
    assert index.ntotal == N_PASSAGES
    assert not index.reconstruct(0).any() and index.reconstruct(SHARD).any()  # shard 0 reused, shard 1 real


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_processes_build_the_same_index_as_one(tmp_path, corpus_file, corpus, encoder, store, queries):
    """What `torchrun --nproc_per_node 2 -m effrag.cli index encode` / accelerate launch set: RANK, WORLD_SIZE."""
    out = tmp_path / "idx2"
    port = str(_free_port())
    procs = [_cli("index", "encode", "--corpus", str(corpus_file), "--output", str(out), "--shard-size", str(SHARD),
                  env=_env(WORLD_SIZE="2", RANK=str(r), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for r in range(2):  # round robin: rank r takes shards r, r + 2, ...
        assert f"rank {r}/2: encoded {N_SHARDS // 2}, kept 0 finished of {N_SHARDS}" in outs[r][0]
    np.testing.assert_allclose(np.asarray(ShardedEmbeddings(out / "emb_shards")), np.asarray(ShardedEmbeddings(store)),
                               atol=1e-5)
    assert cli_main(["index", "build", "--corpus", str(corpus_file), "--retriever", "dense", "--output", str(out),
                     "--shard-size", str(SHARD)]) == 0
    two = load_retriever(out, encoder=encoder)
    one = DenseRetriever(corpus, encoder, embeddings=ShardedEmbeddings(store), gpu=False)
    (ids2, s2), (ids1, s1) = _ids_scores(two.search(queries, 10)), _ids_scores(one.search(queries, 10))
    assert ids2 == ids1
    np.testing.assert_allclose(s2, s1, atol=1e-5)


@pytest.mark.parametrize("index_type", ["ivf", "ivfpq", "hnsw"])
def test_approximate_indexes_from_shards_trained_on_a_sample(index_type, tmp_path, corpus, encoder, store, queries):
    emb = ShardedEmbeddings(store)
    flat = DenseRetriever(corpus, encoder, embeddings=emb, gpu=False)
    approx = DenseRetriever(corpus, encoder, index_type, embeddings=emb, nlist=4, nprobe=4, train_size=70, gpu=False)
    exact_ids, _ = _ids_scores(flat.search(queries, 10))
    ids, _ = _ids_scores(approx.search(queries, 10))
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact_ids)])
    assert recall >= (0.5 if index_type == "ivfpq" else 0.95)
    approx.save(tmp_path / index_type)
    meta = json.loads((tmp_path / index_type / "index_meta.json").read_text())
    assert meta["options"]["train_size"] == 70 and "index.faiss" in meta["files"]
    again = load_retriever(tmp_path / index_type, encoder=encoder, gpu=False)
    assert _ids_scores(again.search(queries, 10))[0] == ids


def test_bm25_loads_memory_mapped(tmp_path, corpus, queries):
    bm25 = BM25Retriever(corpus, show_progress=False)
    bm25.save(tmp_path / "bm25")
    mapped = load_retriever(tmp_path / "bm25", mmap=True)
    assert isinstance(mapped._model.scores["data"], np.memmap)
    assert [[(h.id, h.score) for h in hits] for hits in mapped.search(queries, 10)] == \
        [[(h.id, h.score) for h in hits] for hits in bm25.search(queries, 10)]


@pytest.mark.slow
def test_milvus_lite_matches_faiss_flat(tmp_path, corpus_file, corpus, encoder, store, queries):
    pytest.importorskip("pymilvus", reason="the milvus extra (pymilvus, milvus-lite) is not installed")
    pytest.importorskip("milvus_lite", reason="the milvus extra (pymilvus, milvus-lite) is not installed")
    flat = DenseRetriever(corpus, encoder, embeddings=ShardedEmbeddings(store), gpu=False)
    exact_ids, exact_scores = _ids_scores(flat.search(queries, 10))
    # from the CLI, filling Milvus Lite from the encoded shards
    out = tmp_path / "milvus"
    (out / "emb_shards").parent.mkdir()
    import shutil

    shutil.copytree(store, out / "emb_shards")
    assert cli_main(["index", "build", "--corpus", str(corpus_file), "--retriever", "dense", "--backend", "milvus",
                     "--output", str(out), "--shard-size", str(SHARD)]) == 0
    assert (out / "milvus.db").exists() and json.loads((out / "index_meta.json").read_text())["kind"] == "milvus"
    milvus = load_retriever(out, encoder=encoder)
    assert milvus.kind == "milvus"
    ids, scores = _ids_scores(milvus.search(queries, 10))
    assert ids == exact_ids
    np.testing.assert_allclose(scores, exact_scores, atol=1e-5)
    # Milvus Lite serves one process: once closed here, another process (an `effrag eval`, a replica) can open it
    milvus.close()
    probe = subprocess.run([sys.executable, "-c", "from effrag.retrieval.milvus import connect; "
                            f"print(connect({str(out / 'milvus.db')!r}).list_collections())"],
                           capture_output=True, text=True, env=_env(), timeout=120)
    assert probe.returncode == 0 and "effrag" in probe.stdout, probe.stderr[-500:]
    # a Milvus index holds dense vectors: `effrag eval --index DIR --retriever dense` takes it (issue #41)
    dev = sample_path("hotpotqa", "dev")
    run = ["eval", "--method", "direct-r", "--index", str(out), "--questions", str(dev), "--limit", "2", "--k", "3"]
    assert cli_main(run + ["--retriever", "dense", "--output", str(tmp_path / "eval")]) == 0
    assert [len(json.loads(r)["retrieved"]) for r in (tmp_path / "eval" / "predictions.jsonl").open()] == [3, 3]
    assert cli_main(run + ["--retriever", "bm25", "--output", str(tmp_path / "eval-bm25")]) == 2
    # from Python, the same collection code
    py = build_retriever("milvus", corpus, encoder=encoder, uri=str(tmp_path / "py.db"),
                         embeddings=ShardedEmbeddings(store), show_progress=False)
    assert _ids_scores(py.search(queries, 10))[0] == exact_ids


def test_faiss_gpu_sharding_matches_cpu(corpus, encoder, store, queries):
    faiss = pytest.importorskip("faiss")
    if not hasattr(faiss, "index_cpu_to_all_gpus") or not hasattr(faiss, "GpuMultipleClonerOptions") \
            or faiss.get_num_gpus() < 1:
        pytest.skip("no FAISS GPU build or no GPU visible (faiss-cpu here); GPU sharding path not run")
    emb = ShardedEmbeddings(store)
    cpu = DenseRetriever(corpus, encoder, embeddings=emb, gpu=False)
    gpu = DenseRetriever(corpus, encoder, embeddings=emb, gpu="auto", shard_gpu=True)
    assert gpu.on_gpu
    (ids_g, s_g), (ids_c, s_c) = _ids_scores(gpu.search(queries, 10)), _ids_scores(cpu.search(queries, 10))
    assert ids_g == ids_c
    np.testing.assert_allclose(s_g, s_c, atol=1e-4)
