"""Fixtures of the EfficientRAG loop and API tests: real BM25 over the first 40 bundled HotpotQA dev questions'
contexts, the tiny Labeler and Filter (tests/conftest.py), loaded once with their original head weights."""
from __future__ import annotations

import pytest
from helpers import bm25_over, hotpot_dev, loaded_models

N_QUESTIONS = 5  # the questions most tests run


@pytest.fixture(scope="module")
def hotpot():
    return hotpot_dev(40)


@pytest.fixture(scope="module")
def retriever(hotpot):
    return bm25_over(hotpot)


@pytest.fixture(scope="module")
def questions(hotpot):
    return [q.question for q in hotpot[:N_QUESTIONS]]


@pytest.fixture(scope="module")
def model_dirs(tiny_efficientrag_dirs):
    """A tiny Labeler and Filter saved in the effrag checkpoint format (tests/conftest.py)."""
    return tiny_efficientrag_dirs


@pytest.fixture(scope="module")
def models(model_dirs):
    return loaded_models(model_dirs)
