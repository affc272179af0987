"""A full disk is one line naming the file and exit 2, not a traceback (issue #46, 8): `effrag index build` (BM25,
dense) and `effrag eval` writing into a real full filesystem (a 300 KB tmpfs, where this machine lets the tests
mount one), the plot of `effrag eval` onto a disk that fills while it is written (issue #69, 5), and the write
guard itself on a simulated short write."""
from __future__ import annotations

import contextlib
import errno
import subprocess
import uuid

import pytest
from helpers import run_cli

from effrag.data import sample_path
from effrag.integrity import writing

DEV = sample_path("hotpotqa", "dev")


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MB tmpfs, room for a small eval's outputs (root only): :func:`fill` makes it a real full filesystem."""
    with _tmpfs(tmp_path, "2m") as mount:
        yield mount


@pytest.fixture
def full_fs(tmp_path):
    """A 300 KB tmpfs filled to the last block: a real full filesystem (root only)."""
    with _tmpfs(tmp_path, "300k") as mount:
        fill(mount)
        yield mount


@contextlib.contextmanager
def _tmpfs(tmp_path, size: str):
    mount = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]}); the simulated test covers it")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def fill(mount) -> None:
    """Write zeros into ``mount`` until its filesystem has no block left."""
    try:
        with open(mount / "fill", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC


def _one_error_line(err: str) -> str:
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.startswith("effrag: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_index_build_into_a_full_disk_is_one_line(full_fs, kind, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    assert run_cli(["corpus", "build", "--inputs", DEV, "--output", corpus], capsys)[0] == 0
    code, _, err = run_cli(["index", "build", "--corpus", corpus, "--retriever", kind, "--output",
                            full_fs / "idx"], capsys)
    line = _one_error_line(err)
    assert code == 2 and str(full_fs / "idx") in line and "the disk is full" in line


def test_eval_output_onto_a_full_disk_is_one_line(full_fs, capsys):
    code, _, err = run_cli(["eval", "--method", "direct-r", "--retriever", "bm25", "--questions", DEV,
                            "--corpus-from", DEV, "--limit", "20", "--output", full_fs / "out"], capsys)
    assert code == 2 and "the disk is full" in _one_error_line(err)


def test_the_plot_of_an_eval_onto_a_disk_that_fills_is_one_line_naming_it(small_fs, monkeypatch, capsys):
    """Issue #69, 5: the disk fills after the eval's rows and metrics are written, while its plot is; the line named
    no file. Now it names recall_vs_chunks.png, and the rows stay for the rerun."""
    pytest.importorskip("matplotlib")
    from effrag.evaluation import plots

    read_rows = plots.load_rows

    def rows_then_a_full_disk(sources):
        rows = read_rows(sources)
        fill(small_fs)  # for real: the plot's write gets ENOSPC from the filesystem
        return rows

    monkeypatch.setattr(plots, "load_rows", rows_then_a_full_disk)
    out = small_fs / "out"
    code, _, err = run_cli(["eval", "--method", "direct-r", "--retriever", "bm25", "--questions", DEV,
                            "--corpus-from", DEV, "--limit", "2", "--output", out], capsys)
    line = _one_error_line(err)
    assert code == 2 and line.startswith(f"effrag: error: {out / 'recall_vs_chunks.png'}: ")
    assert "the disk is full" in line
    assert (out / "metrics.json").is_file() and (out / "predictions.jsonl").is_file()


def test_a_short_write_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """numpy and FAISS report a full disk as a short write without errno or file name."""
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    target = tmp_path / "emb_00000.npy"
    with pytest.raises(OSError) as e:
        with writing(target):
            raise OSError("230016 requested and 75744 written")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    with pytest.raises(OSError) as e:
        with writing(target):
            raise RuntimeError("Error in faiss::FileIOWriter::operator() fwrite failed")
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(RuntimeError, match="index is not trained"):  # other errors pass through
        with writing(target):
            raise RuntimeError("index is not trained")
