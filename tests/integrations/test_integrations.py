"""effrag inside LangChain, LlamaIndex and Haystack, each used through its own chain / engine / pipeline.

Everything is real: BM25 (bm25s) over the bundled HotpotQA sample, EfficientRAG with
tiny randomly initialised Labeler/Filter checkpoints saved and loaded through their
format, and the installed frameworks' own classes (LCEL with FakeListLLM, a
RetrieverQueryEngine with LlamaIndex's MockLLM, a Haystack Pipeline with PromptBuilder).
"""
from __future__ import annotations

import asyncio
import json
import os

import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no posthog calls from tests

from helpers import save_tiny_models  # noqa: E402

from effrag.data import Corpus, load_questions, sample_path  # noqa: E402
from effrag.integrations import ChunkSource, as_source  # noqa: E402

K = 5


@pytest.fixture(scope="module")
def hotpot():
    return load_questions(sample_path("hotpotqa", "dev")) + load_questions(sample_path("hotpotqa", "train"))


@pytest.fixture(scope="module")
def bm25(hotpot):
    from effrag.retrieval import build_retriever

    return build_retriever("bm25", Corpus.from_questions(hotpot), show_progress=False)


@pytest.fixture(scope="module")
def questions(hotpot):
    return [q.question for q in hotpot[:3]]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return save_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def rag(model_dirs, bm25):
    from effrag import api

    return api.EfficientRAG.from_pretrained(model_dirs["labeler"], model_dirs["filter"], retriever=bm25,
                                            hop_k=4, max_hops=2, tag_threshold=0.3)


def search_ids(bm25, q, k=K):
    return [h.id for h in bm25.search([q], k)[0]]


# ---------------------------------------------------------------------- the common source

def test_source_over_search_pipeline_and_function_agree(bm25, questions):
    from effrag.pipelines import build_pipeline

    direct = as_source(bm25, k=K).retrieve_batch(questions)
    assert [r.ids for r in direct] == [search_ids(bm25, q) for q in questions]
    hit = bm25.search([questions[0]], K)[0][0]
    c = direct[0].chunks[0]
    assert (c.title, c.text, c.score, c.hop, c.kept_words) == (hit.title, hit.text, hit.score, 0, [])
    assert direct[0].hops == [{"hop": 0, "queries": [questions[0]], "retrieved": direct[0].ids}]
    # top_k reaches the search itself
    assert as_source(bm25, k=K).retrieve(questions[0], top_k=2).ids == search_ids(bm25, questions[0], 2)
    # a registered pipeline: its results carry the passages themselves
    pipe = as_source(build_pipeline("direct-r", bm25, k=K))
    assert pipe.kind == "pipeline" and pipe.method == "direct-r"
    via_pipe = pipe.retrieve_batch(questions)
    assert [r.ids for r in via_pipe] == [r.ids for r in direct]
    assert [c.text for c in via_pipe[1].chunks] == [c.text for c in direct[1].chunks]
    assert via_pipe[0].iterations == 1
    # a plain function returning dict hits
    fn = as_source(lambda qs, k: [[h.to_json() for h in hs] for hs in bm25.search(qs, k)], k=K)
    assert [r.ids for r in fn.retrieve_batch(questions)] == [r.ids for r in direct]


def test_source_rejects_bad_input(bm25, questions):
    src = as_source(bm25)
    with pytest.raises(ValueError, match=r"does not take option\(s\) tag_threshold \(allowed: none\)"):
        src.retrieve(questions[0], tag_threshold=0.3)
    with pytest.raises(ValueError, match="question 1 is empty"):
        src.retrieve_batch([questions[0], "  "])
    with pytest.raises(TypeError, match="list of questions"):
        src.retrieve_batch(questions[0])
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        src.retrieve(questions[0], top_k=0)
    with pytest.raises(TypeError, match="cannot retrieve with a int"):
        ChunkSource(42)

    class IdsOnly:  # a pipeline returning passage ids instead of a Result
        def run(self, q):
            return {"retrieved": ["x"], "scores": [1.0]}

    with pytest.raises(TypeError, match="IdsOnly returned a dict; a pipeline returns effrag.pipelines.Result"):
        as_source(IdsOnly()).retrieve("q")


def test_source_over_efficientrag(rag, model_dirs, bm25, questions):
    from effrag.pipelines import build_pipeline

    expected = rag.retrieve_batch(questions)
    got = as_source(rag).retrieve_batch(questions)
    assert [r.ids for r in got] == [e.ids for e in expected]
    assert [[c.kept_words for c in r.chunks] for r in got] == [[c.kept_words for c in e] for e in expected]
    assert got[0].hops == expected[0].hops and got[0].iterations == expected[0].iterations
    assert any(c.kept_words for r in got for c in r.chunks), "tiny labeler should keep some words"
    # per-call thresholds apply to that call only
    src = as_source(rag)
    assert src.method == "efficientrag" and "tag_threshold" in src.options
    assert all(r.chunks == [] for r in src.retrieve_batch(questions, tag_threshold=1.0))
    everything = src.retrieve(questions[0], tag_threshold=0.0, max_hops=1)
    assert sorted(everything.ids) == sorted(search_ids(bm25, questions[0], 4))  # every hop-0 chunk continues
    assert rag.config.tag_threshold == 0.3 and rag.config.max_hops == 2
    assert [r.ids for r in src.retrieve_batch(questions)] == [e.ids for e in expected]
    assert src.retrieve(questions[0], top_k=1).ids == expected[0].ids[:1]
    # the registered efficientrag pipeline gives the same chunks (with kept words) in its results
    pipe = build_pipeline("efficientrag", bm25, labeler=str(model_dirs["labeler"]), filter=str(model_dirs["filter"]),
                          hop_k=4, max_hops=2, tag_threshold=0.3)
    via_pipe = as_source(pipe).retrieve_batch(questions)
    assert [r.ids for r in via_pipe] == [e.ids for e in expected]
    assert via_pipe[0].chunks[0].kept_words == expected[0][0].kept_words
    assert via_pipe[0].hops == expected[0].hops  # the registered pipeline and the API object are one
    # per-call options reach the pipeline's loop too, for that call only
    assert all(r.chunks == [] for r in as_source(pipe).retrieve_batch(questions, tag_threshold=1.0))
    assert pipe.config.tag_threshold == 0.3


# ---------------------------------------------------------------------- LangChain

def test_langchain_retriever_in_an_lcel_chain(bm25, questions):
    from langchain_core.language_models import FakeListLLM
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    from effrag.integrations.langchain import EffragLangChainRetriever

    retriever = EffragLangChainRetriever.from_effrag(bm25, k=K)
    docs = retriever.invoke(questions[0])
    assert [d.metadata["id"] for d in docs] == search_ids(bm25, questions[0])
    assert [d.metadata["rank"] for d in docs] == list(range(K))
    assert docs[0].id == docs[0].metadata["id"] and docs[0].metadata["hop"] == 0
    assert [d.metadata["id"] for d in retriever.invoke(questions[0], top_k=2)] == search_ids(bm25, questions[0], 2)
    async_docs = asyncio.run(retriever.ainvoke(questions[0]))
    assert [d.metadata["id"] for d in async_docs] == [d.metadata["id"] for d in docs]
    assert retriever.batch(questions[:2])[1] == retriever.invoke(questions[1])
    assert EffragLangChainRetriever(source=bm25, top_k=3).invoke(questions[0])[2].metadata["id"] == \
        search_ids(bm25, questions[0], 3)[2]

    prompts: list[str] = []

    def record(prompt):
        prompts.append(prompt.to_string())
        return prompt

    fmt = RunnableLambda(lambda ds: "\n\n".join(f"{d.metadata['title']}: {d.page_content}" for d in ds))
    chain = ({"context": retriever | fmt, "question": RunnablePassthrough()}
             | PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}\nAnswer:")
             | RunnableLambda(record) | FakeListLLM(responses=["an answer"]))
    assert chain.invoke(questions[0]) == "an answer"
    assert f"{docs[0].metadata['title']}: {docs[0].page_content}" in prompts[0]
    assert prompts[0].endswith(f"Question: {questions[0]}\nAnswer:")


def test_langchain_over_efficientrag_carries_hops_and_kept_words(rag, questions):
    from effrag.integrations.langchain import EffragLangChainRetriever

    expected = rag.retrieve(questions[0])
    docs = EffragLangChainRetriever.from_effrag(rag, content="kept_words").invoke(questions[0])
    assert [d.metadata["id"] for d in docs] == expected.ids
    for d, c in zip(docs, expected):
        assert (d.metadata["hop"], d.metadata["kept_words"], d.metadata["score"]) == (c.hop, c.kept_words, c.score)
        assert d.page_content == (c.kept_text or c.text)
    assert EffragLangChainRetriever.from_effrag(rag, options={"tag_threshold": 1.0}).invoke(questions[0]) == []
    with pytest.raises(ValueError, match="content must be one of"):
        EffragLangChainRetriever.from_effrag(rag, content="summary")


# ---------------------------------------------------------------------- LlamaIndex

def test_llamaindex_retriever_in_a_query_engine(bm25, rag, questions):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from effrag.integrations.llamaindex import EffragLlamaIndexRetriever

    retriever = EffragLlamaIndexRetriever.from_effrag(bm25, k=K)
    nodes = retriever.retrieve(questions[0])
    hits = bm25.search([questions[0]], K)[0]
    assert [n.node.node_id for n in nodes] == [h.id for h in hits]
    assert [n.score for n in nodes] == pytest.approx([h.score for h in hits])
    assert nodes[0].node.metadata["title"] == hits[0].title and nodes[0].node.text == hits[0].text
    assert [n.node.node_id for n in asyncio.run(retriever.aretrieve(questions[0]))] == [h.id for h in hits]

    engine = RetrieverQueryEngine.from_args(EffragLlamaIndexRetriever(bm25, k=K, top_k=2), llm=MockLLM())
    response = engine.query(questions[0])  # MockLLM echoes the prompt it was given
    assert [n.node.node_id for n in response.source_nodes] == [h.id for h in hits[:2]]
    prompt = str(response)
    assert hits[0].text in prompt and f"title: {hits[0].title}" in prompt and questions[0] in prompt
    assert "kept_words" not in prompt and "rank:" not in prompt  # bookkeeping stays out of the prompt
    aresponse = asyncio.run(engine.aquery(questions[0]))  # the query engine's async path
    assert [n.node.node_id for n in aresponse.source_nodes] == [h.id for h in hits[:2]]

    er_nodes = EffragLlamaIndexRetriever(rag).retrieve(questions[1])
    expected = rag.retrieve(questions[1])
    assert [(n.node.node_id, n.node.metadata["hop"], n.node.metadata["kept_words"]) for n in er_nodes] == \
        [(c.id, c.hop, c.kept_words) for c in expected]


# ---------------------------------------------------------------------- Haystack

def test_haystack_component_in_a_pipeline(bm25, rag, questions):
    from haystack import Pipeline, component
    from haystack.components.builders import PromptBuilder

    from effrag.integrations.haystack import EffragHaystackRetriever

    @component
    class EchoGenerator:  # a trivial local generator: replies with the prompt it got
        @component.output_types(replies=list[str])
        def run(self, prompt: str):
            return {"replies": [prompt]}

    comp = EffragHaystackRetriever(bm25, k=K)
    out = comp.run(query=questions[0])
    assert [d.id for d in out["documents"]] == search_ids(bm25, questions[0])
    assert out["documents"][0].meta["title"] and out["documents"][0].score > 0
    assert [d.id for d in comp.run(query=questions[0], top_k=2)["documents"]] == search_ids(bm25, questions[0], 2)

    p = Pipeline()
    p.add_component("retriever", EffragHaystackRetriever(rag))
    p.add_component("prompt", PromptBuilder(
        template="{% for d in documents %}[hop {{ d.meta.hop }}] {{ d.meta.title }}: {{ d.content }}\n{% endfor %}"
                 "Question: {{ question }}", required_variables=["documents", "question"]))
    p.add_component("llm", EchoGenerator())
    p.connect("retriever.documents", "prompt.documents")
    p.connect("prompt.prompt", "llm.prompt")
    result = p.run({"retriever": {"query": questions[0]}, "prompt": {"question": questions[0]}},
                   include_outputs_from={"retriever"})
    expected = rag.retrieve(questions[0])
    assert [d.id for d in result["retriever"]["documents"]] == expected.ids
    assert result["retriever"]["trace"] == expected.trace_json()
    reply = result["llm"]["replies"][0]
    assert reply.endswith(f"Question: {questions[0]}")
    assert all(f"[hop {c.hop}] {c.title}: {c.text}" in reply for c in expected)


def test_haystack_pipeline_saves_and_loads_with_the_component(tmp_path, bm25, model_dirs, questions):
    """Pipeline.dumps()/loads() (YAML) round-trips an EfficientRAG component built from paths; one built from
    Python objects says how to make it saveable instead of failing deep inside Haystack."""
    from haystack import Pipeline
    from haystack.core.errors import SerializationError

    from effrag.integrations.haystack import EffragHaystackRetriever

    bm25.save(tmp_path / "index")
    (tmp_path / "loop.json").write_text(json.dumps({"hop_k": 4, "max_hops": 2, "tag_threshold": 0.3}))
    comp = EffragHaystackRetriever.from_paths(index=str(tmp_path / "index"), labeler=model_dirs["labeler"],
                                              filter=model_dirs["filter"], loop_config=str(tmp_path / "loop.json"))
    from effrag.pipelines import DEFAULT_METHOD, get_pipeline_class

    # checkpoints without a method go to the registry's default method, recorded by name for the reload
    assert comp.to_dict()["init_parameters"]["method"] == DEFAULT_METHOD
    assert type(comp.source.obj) is get_pipeline_class(DEFAULT_METHOD)
    p = Pipeline()
    p.add_component("retriever", comp)
    text = p.dumps()
    assert "from_paths" not in text and str(tmp_path / "loop.json") in text
    # Haystack only rebuilds classes from trusted modules: the user names ours when loading
    again = Pipeline.loads(text, allowed_modules=["effrag.integrations.haystack"])
    first = p.run({"retriever": {"query": questions[0]}})["retriever"]
    second = again.run({"retriever": {"query": questions[0]}})["retriever"]
    assert [d.id for d in first["documents"]] == [d.id for d in second["documents"]] and first["documents"]
    assert first["trace"] == second["trace"]
    plain = EffragHaystackRetriever.from_paths(index=str(tmp_path / "index"), top_k=2)
    assert EffragHaystackRetriever.from_dict(plain.to_dict()).run(query=questions[0])["documents"][1].id == \
        search_ids(bm25, questions[0], 2)[1]
    with pytest.raises(SerializationError, match="from_paths"):
        EffragHaystackRetriever(bm25).to_dict()
    with pytest.raises(ValueError, match="both --labeler DIR and --filter DIR"):
        EffragHaystackRetriever.from_paths(index=str(tmp_path / "index"), labeler=model_dirs["labeler"])


# ---------------------------------------------------------------------- report plot

def test_report_plot_from_eval_runs(tmp_path, bm25, hotpot):
    import matplotlib.image as mpimg
    import numpy as np

    from effrag.data import map_gold
    from effrag.evaluation import evaluate
    from effrag.evaluation.plots import load_rows, recall_table, write_report_plot
    from effrag.pipelines import build_pipeline

    qs = hotpot[:10]
    entries = evaluate(build_pipeline("direct-r", bm25, k=20), qs, map_gold(qs, bm25.corpus), tmp_path / "direct",
                       {"method": "direct-r", "retriever": "bm25"}, ks=[2, 5, 20], show_progress=False)
    other = {"method": "efficientrag", "dataset": "musique", "recall": 0.5, "avg_chunks": 6.5, "k": 10}
    paths = write_report_plot([tmp_path / "direct", other], tmp_path / "report", title="sample")
    img = mpimg.imread(paths["png"])
    assert img.shape[1] > img.shape[0] * 2  # two panels side by side (hotpotqa, musique)
    rgb = (img[..., :3] * 255).round().astype(int)
    for color in ((31, 119, 180), (255, 127, 14)):  # the two series' line colours are drawn
        assert (np.abs(rgb - color).sum(axis=-1) < 30).sum() > 50
    md = paths["md"].read_text()
    assert "![recall vs chunks](recall_vs_chunks.png)" in md
    for e in entries:
        assert f"| hotpotqa | direct-r | k={e['k']} | {e['avg_chunks']:.2f} | {100 * e['recall']:.2f} |" in md
    assert "| musique | efficientrag | k=10 | 6.50 | 50.00 |" in md
    assert load_rows([tmp_path / "direct" / "metrics.json"])[0]["source"].endswith("metrics.json")
    with pytest.raises(ValueError, match="row 0 .* lacks avg_chunks"):
        recall_table([{"method": "x", "recall": 0.1}])
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        load_rows([tmp_path / "nowhere"])
