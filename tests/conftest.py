"""Shared fixtures: the bundled real sample, loaded once per test session; the checkout's command entry points."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import reset_accelerate

from effrag.data import Corpus, load_questions, sample_files

ROOT = Path(__file__).parents[1]


def pytest_configure(config):
    """``effrag synthesize`` and the other training-data commands reach ``effrag`` through the ``effrag.commands``
    entry points of ``pyproject.toml``. Where the installed metadata predates them (an editable install made from an
    older checkout), this checkout's are declared for the session, in process and for subprocesses alike."""
    import atexit
    import shutil
    import tempfile

    from helpers import write_command_entry_points

    from effrag.cli import DATA_COMMANDS, command_entry_points

    if set(DATA_COMMANDS) <= {ep.name for ep in command_entry_points()}:
        return
    root = Path(tempfile.mkdtemp(prefix="effrag-entry-points-"))
    atexit.register(shutil.rmtree, root, True)
    write_command_entry_points(root)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))


@pytest.fixture(autouse=True)
def reset_accelerate_after_test():
    """A test (or module fixture) that trained in process must not fix the next training's mixed precision ("no"
    on most CPUs, bf16 on a CPU with AMX: accelerate refuses the change)."""
    yield
    if "accelerate.state" in sys.modules:
        reset_accelerate()


@pytest.fixture(scope="session")
def sample_dev_questions():
    """Questions of every bundled dev sample (HotpotQA, 2Wiki, MuSiQue, Bamboogle, StrategyQA)."""
    return [q for f in sample_files("dev") for q in load_questions(f)]


@pytest.fixture(scope="session")
def sample_train_questions():
    """Questions of the bundled train samples (HotpotQA, 2Wiki, MuSiQue)."""
    return [q for f in sample_files("train") for q in load_questions(f)]


@pytest.fixture(scope="session")
def sample_corpus(sample_dev_questions, sample_train_questions):
    """Corpus pooling the contexts of all bundled train and dev samples."""
    return Corpus.from_questions(sample_train_questions + sample_dev_questions)


@pytest.fixture(scope="session")
def tiny_efficientrag_dirs(tmp_path_factory):
    """A tiny Labeler and Filter (2-layer BERT, MiniLM tokenizer) saved in the effrag checkpoint format.

    Randomly initialised with widened heads, so that p(<Continue>) and word keep probabilities spread
    over (0, 1) and every threshold in a grid changes what the loop does.
    """
    from helpers import make_tiny_efficientrag

    return make_tiny_efficientrag(tmp_path_factory.mktemp("tiny_efficientrag"))


@pytest.fixture
def fresh_accelerate_state():
    """One torch thread during a training test, and a clean accelerate state after it
    (``pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    reset_accelerate()
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny ELECTRA base and learnable Labeler / Filter files (tests/helpers.py ``make_tiny_training_data``)."""
    from helpers import make_tiny_training_data

    return make_tiny_training_data(tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from threads, and on 2 shared cores threads thrash; restored afterwards.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
