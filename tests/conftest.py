"""Shared fixtures: the bundled real sample, loaded once per test session."""
from __future__ import annotations

import pytest

from effrag.data import Corpus, load_questions, sample_files


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
