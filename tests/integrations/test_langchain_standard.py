"""LangChain's own conformance suite for retrievers, run against EffragLangChainRetriever.

``langchain_tests.integration_tests.RetrieversIntegrationTests`` (package ``langchain-tests``, pinned in the
``test`` extra to match ``langchain-core``) checks LangChain's conventions: ``k`` in the constructor and per
``invoke`` call gives exactly that many documents, and sync and async calls return ``Document`` lists.
"""
from __future__ import annotations

from functools import lru_cache

import pytest

pytest.importorskip("langchain_core")
standard = pytest.importorskip("langchain_tests.integration_tests")

from effrag.data import Corpus, load_questions, sample_path  # noqa: E402
from effrag.integrations.langchain import EffragLangChainRetriever  # noqa: E402


@lru_cache(maxsize=1)
def _bm25():
    from effrag.retrieval import build_retriever

    qs = load_questions(sample_path("hotpotqa", "dev"))
    return build_retriever("bm25", Corpus.from_questions(qs), show_progress=False)


class TestEffragLangChainRetrieverStandard(standard.RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[EffragLangChainRetriever]:
        return EffragLangChainRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"source": _bm25()}

    @property
    def retriever_query_example(self) -> str:
        return "Which magazine was started first, Arthur's Magazine or First for Women?"


def test_unknown_fields_and_bad_k_are_errors():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="kk"):
        EffragLangChainRetriever(source=_bm25(), kk=3)
    with pytest.raises(ValidationError):
        EffragLangChainRetriever(source=_bm25(), k=0)
    r = EffragLangChainRetriever(source=_bm25(), top_k=2)  # the old name stays an alias
    assert r.k == 2 and len(r.invoke("magazine")) == 2 and len(r.invoke("magazine", k=4)) == 4
    with pytest.raises(ValueError, match="k must be a positive integer"):
        r.invoke("magazine", k=0)
