"""Faults of the late-interaction vector store (effrag.models.late_vectors; issue #69, 4-6), each made for real: a cap
that is not a finite number, a second process pruning the store while this one loads from it, and the temporary
file a writer killed mid-write leaves."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from effrag.models import late_vectors
from effrag.models.late_vectors import VectorStore, chunk_digest, prune, store_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[2]
VARIANT = {"weights": "0123456789abcdef-0123456789abcdef", "dim": 4, "dtype": "fp32", "max_length": 16}


def _python(script: str, *args, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], env=env, **popen)


def _shards(store: VectorStore, n: int, per: int = 4) -> dict[bytes, torch.Tensor]:
    """``n`` shards of ``per`` chunks each written by ``store``; returns every chunk's vectors by digest."""
    made = {}
    for s in range(n):
        digests = [chunk_digest([f"chunk {s}-{i}"]) for i in range(per)]
        vecs = [torch.randn(3 + i, VARIANT["dim"], generator=torch.Generator().manual_seed(s * 100 + i))
                for i in range(per)]
        store.add(digests, vecs)
        made.update(zip(digests, vecs))
    return made


# ---------------------------------------------------------------- 4. the cap's variable
@pytest.mark.parametrize("raw", ["inf", "1e400", "nan", "-1", "lots"])
def test_a_cap_that_is_not_a_finite_number_is_one_line_naming_the_variable(raw, monkeypatch, tmp_path):
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, raw)
    with pytest.raises(ValueError) as e:
        VectorStore(tmp_path, VARIANT)  # a store checks it when it opens: before anything is encoded
    assert str(e.value) == (f"EFFRAG_LATE_VECTORS_MAX_GB={raw!r}: expected a finite number of GB >= 0 (0: never "
                            "pruned; unset: 8)")
    for ok, cap in (("0", None), ("0.5", 500_000_000), ("1e300", int(1e27)), (" ", 8_000_000_000)):
        monkeypatch.setenv(late_vectors.MAX_GB_ENV, ok)
        assert late_vectors.max_store_bytes() == cap


def test_the_cli_refuses_an_infinite_cap_before_encoding_the_corpus(tiny_efficientrag_dirs, tmp_path, capsys,
                                                                    monkeypatch):
    """`effrag eval --model SYSTEM` whose ranker is a late ranker, with EFFRAG_LATE_VECTORS_MAX_GB=inf: it was an
    OverflowError traceback once every chunk was encoded and stored; now one line, and no chunk encoded."""
    from helpers import run_cli, tiny_bert_base

    from effrag.data import sample_path
    from effrag.models import LateRankerModel

    system = tmp_path / "system"
    for name in ("labeler", "filter"):
        shutil.copytree(tiny_efficientrag_dirs[name], system / name)
    base = tiny_bert_base(tmp_path / "base", seed=5)
    LateRankerModel.from_encoder(str(base), {"dim": 16, "max_length": 48, "query_max_length": 16}).save_pretrained(
        system / "ranker")
    (system / "loop.json").write_text(json.dumps({"config": {"max_hops": 2, "hop_k": 3, "pool_order": "rank"},
                                                  "retriever": "bm25"}))
    encoded = []
    monkeypatch.setattr(LateRankerModel, "_encode_all", lambda self, texts, *a, **k: encoded.append(texts) or 1 / 0)
    monkeypatch.setenv("EFFRAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "inf")
    dev = sample_path("hotpotqa", "dev")
    capsys.readouterr()  # what saving the ranker printed
    code, _, err = run_cli(["eval", "--method", "efficientrag", "--model", system, "--questions", dev,
                            "--corpus-from", dev, "--retriever", "bm25", "--limit", "2", "--cache-dir",
                            tmp_path / "idx", "--output", tmp_path / "out"], capsys)
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.startswith("effrag:")]  # not the index's bars
    assert code == 2 and "Traceback" not in err, err
    assert lines == [
        "effrag: error: EFFRAG_LATE_VECTORS_MAX_GB='inf': expected a finite number of GB >= 0 (0: never pruned; "
        "unset: 8)"]
    assert encoded == [] and not (tmp_path / "cache" / "late-vectors").exists()


# ---------------------------------------------------------------- 5. a concurrent prune
PRUNER = """
    import os, shutil, sys, time
    from pathlib import Path
    from effrag.models.late_vectors import prune
    template, root, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    names = sorted(p.name for p in template.iterdir())
    print("ready", flush=True)
    rounds, end = 0, time.time() + seconds
    while time.time() < end:
        folder = root / template.name
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:  # the shards put back whole, as a writer does
            shutil.copyfile(template / name, folder / (name + ".tmp0"))
            os.replace(folder / (name + ".tmp0"), folder / name)
        time.sleep(0.001)
        prune(root, 0)  # every shard goes, then the emptied folder
        rounds += 1
    print(rounds, flush=True)
"""


def test_a_prune_by_another_process_is_a_miss_never_an_error_nor_a_wrong_vector(tmp_path, caplog):
    """A second process fills the store's folder and prunes all of it (folder included), hundreds of times a second,
    while this one loads from it and prunes too: every load returns right vectors or none (FileNotFoundError out of
    load and prune was 1 in 32,725 loads and 22 in 542,844 prunes), and no shard is taken for a damaged one."""
    folder = store_folder(tmp_path / "store", VARIANT)
    template = VectorStore(tmp_path / "template" / folder.name, VARIANT)
    made = _shards(template, 6)
    proc = _python(PRUNER, template.folder, tmp_path / "store", 2.0, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    loads = {"all": 0, "some": 0, "none": 0}
    with caplog.at_level(logging.WARNING, logger="effrag.models.late_vectors"):
        while proc.poll() is None:
            found = VectorStore(folder, VARIANT).load(made)
            for d, vec in found.items():
                assert torch.equal(vec, made[d])
            loads["all" if len(found) == len(made) else "some" if found else "none"] += 1
            prune(tmp_path / "store", 1 << 40)
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert int(out) > 100 and loads["all"] + loads["some"] > 20 and loads["none"] > 20, (out, loads)
    assert caplog.records == []  # a vanished shard is a miss: not "unreadable", not removed as damaged


# ---------------------------------------------------------------- 6. a killed writer's temporary file
WRITER = """
    import sys, time
    import torch
    from effrag import state_files
    from effrag.models.late_vectors import VectorStore, chunk_digest
    def killed_before_the_rename(tmp, path):
        print(tmp, flush=True)
        time.sleep(600)
    state_files.commit = killed_before_the_rename
    store = VectorStore(sys.argv[1], {"weights": "0123456789abcdef-0123456789abcdef", "dim": 4, "dtype": "fp32",
                                      "max_length": 16})
    store.add([chunk_digest([str(i)]) for i in range(64)], [torch.ones(40, 4)] * 64)
"""


def test_a_killed_writers_temporary_file_counts_in_the_cap_and_is_removed_once_stale(tmp_path, monkeypatch):
    from effrag.state_files import temp_owner

    folder = store_folder(tmp_path, VARIANT)
    proc = _python(WRITER, folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp = Path(proc.stdout.readline().strip())  # written whole under its temporary name, not renamed yet
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -9 and tmp.is_file() and temp_owner(tmp.name) == proc.pid
    assert tmp.parent == folder and tmp.name.startswith("vectors-") and ".safetensors.tmp" in tmp.name

    other = VectorStore(tmp_path / "other-variant", VARIANT)  # an older shard of another variant
    _shards(other, 1)
    (shard,) = other.folder.glob("vectors-*.safetensors")
    old, shard_size = time.time() - 300, shard.stat().st_size
    os.utime(shard, (old, old))
    # the temporary file counts in the cap: with it the two exceed the cap, so the older shard goes; the temporary
    # file is kept, its writer gone only seconds ago (a writer in another pid namespace may still be writing it)
    assert prune(tmp_path, shard_size + tmp.stat().st_size - 1) == (1, shard_size)
    assert tmp.is_file() and not shard.exists()
    # a minute later it is stale: the store's own prune removes it, also with no cap at all, and its empty folder
    stale = time.time() - late_vectors.TEMP_GRACE_S - 5
    os.utime(tmp, (stale, stale))
    monkeypatch.setenv(late_vectors.MAX_GB_ENV, "0")
    size = tmp.stat().st_size
    VectorStore(tmp_path / "third", VARIANT).prune_others()
    assert not tmp.exists() and not folder.exists()
    # a temporary file of a live writer (this process) stays as long as it is written to; an hour untouched, it goes
    live = VectorStore(folder, VARIANT)
    folder.mkdir()
    ours = folder / f"vectors-0.safetensors.tmp{os.getpid()}-0"
    ours.write_bytes(b"\0" * size)
    os.utime(ours, (stale, stale))
    live.prune_others()
    assert ours.exists()
    ancient = time.time() - late_vectors.TEMP_MAX_AGE_S - 5
    os.utime(ours, (ancient, ancient))
    live.prune_others()
    assert not ours.exists()
