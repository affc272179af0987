"""The loop's reads built from chunk sub-tokens computed once (effrag.models.pair_encoding) and its prepared corpus
(EfficientRAGLoop.prepare): the same model inputs as the tokenizer's own pair encoding, the same results, and a
chunk read as text only never gets the words of its title-and-text reading from the cache."""
from __future__ import annotations

import pytest
from helpers import fixed_heads, make_spm_tokenizer, make_wordpiece_tokenizer

from effrag.models.heads import load_tokenizer, resolve_encoder
from effrag.models.pair_encoding import PairEncoder, pair_encoder
from effrag.models.tokenization import encode_pairs
from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop
from effrag.text import chunk_text, words, words_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ODD_WORDS = ["東京", "Café", "naïve", "\x00\x07", "x" * 150, "re-entry", "U.S.", "100,000", "(", "e.g.", "🙂"]


def pairs_of(hotpot, n: int = 25):
    """(query words, chunk words) of the bundled questions over their own contexts, with long, empty and odd ones."""
    qs, cs = [], []
    for q in hotpot[:n]:
        for p in q.contexts:
            qs.append(q.question)
            cs.append(chunk_text(p.title, p.text))
    qw, cw = words_batch(qs), words_batch(cs)
    qw += [q * 12 for q in qw[:6]] + [[], [], ["y" * 400], ODD_WORDS]
    cw += cw[:6] + [[], ODD_WORDS, cw[0], ODD_WORDS * 30]
    return qw, cw


@pytest.mark.parametrize("max_length", [256, 128, 40, 12])
def test_spliced_pairs_equal_the_tokenizers_own(hotpot, max_length):
    tok = load_tokenizer(resolve_encoder("minilm"))
    enc = PairEncoder(tok)
    assert enc.fast, "MiniLM's WordPiece pairs are [CLS] A [SEP] B [SEP]: the splice must be taken"
    qw, cw = pairs_of(hotpot)
    want = [vars(e) for e in encode_pairs(tok, qw, cw, None, max_length)]
    assert [vars(e) for e in enc.encode(qw, cw, max_length)] == want  # every chunk tokenised here
    assert len(enc) == len({tuple(c) for c in cw})
    assert [vars(e) for e in enc.encode(qw, cw, max_length)] == want  # every chunk from the cache
    assert any(e["truncated"] for e in want)  # truncation is exercised at every length


def test_other_templates_fall_back_to_the_tokenizers_own(hotpot, tmp_path):
    """A RoBERTa-style pair template ([CLS] A [SEP] [SEP] B [SEP]) is not spliced; sentencepiece with the BERT
    template is, where its probe agrees; both give the tokenizer's own encoding."""
    from tokenizers import processors

    roberta = make_wordpiece_tokenizer()
    cls, sep = roberta.cls_token_id, roberta.sep_token_id
    roberta.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    spm = make_spm_tokenizer(tmp_path / "spm")
    qw, cw = pairs_of(hotpot, 6)
    for tok, spliced in ((roberta, False), (spm, None)):
        enc = PairEncoder(tok)
        if spliced is not None:
            assert enc.fast is spliced
        for max_length in (128, 20):
            assert [vars(e) for e in enc.encode(qw, cw, max_length)] == \
                [vars(e) for e in encode_pairs(tok, qw, cw, None, max_length)]


def test_the_cache_is_bounded_and_shared_by_equal_tokenizers(hotpot):
    a, b = load_tokenizer(resolve_encoder("minilm")), load_tokenizer(resolve_encoder("minilm"))
    assert pair_encoder(a) is pair_encoder(b)  # the Labeler's and a ranker's tokenizer: one cache
    assert pair_encoder(a) is not pair_encoder(make_wordpiece_tokenizer())
    enc = PairEncoder(a, capacity=5)
    _, cw = pairs_of(hotpot, 3)
    enc.chunk_tokens(cw)
    assert len(enc) == 5
    first = enc.chunk_tokens(cw[-1:])[0]
    assert enc.chunk_tokens(cw[-1:])[0] is first  # the most recent chunks stay


def test_a_prepared_loop_reads_the_same_and_splits_nothing_at_question_time(models, retriever, questions,
                                                                            monkeypatch):
    import effrag.pipelines.efficientrag.loop as loop_module

    lab, fil = fixed_heads(models)
    cfg = EfficientRAGConfig(hop_k=3, max_hops=2, tag_threshold=0.0, token_threshold=0.5)
    plain = EfficientRAGLoop(lab, fil, retriever, cfg).run(questions)
    prepared = EfficientRAGLoop(lab, fil, retriever, cfg)
    info = prepared.prepare()
    assert info["passages"] == len(retriever.corpus) > 0
    split = []
    real = loop_module.words_batch
    monkeypatch.setattr(loop_module, "words_batch", lambda texts: split.append(len(texts)) or real(texts))
    again = prepared.run(questions)
    assert split == []  # every chunk a question read was split before it
    for a, b in zip(plain, again):
        assert [(c.id, c.kept_words) for c in a.chunks] == [(c.id, c.kept_words) for c in b.chunks]
        assert [c.score for c in a.chunks] == pytest.approx([c.score for c in b.chunks], abs=1e-5)


def test_a_chunk_read_as_text_only_gets_its_text_words_after_a_title_reading(models, retriever, questions):
    """Reading chunks as title + text, then (a request's or ``rag.config``'s) ``chunk_format: text`` must read
    the text alone: the words cache is keyed by the format too (it was by chunk id alone)."""
    lab, fil = fixed_heads(models, tag=+20, token=+20)
    cfg = EfficientRAGConfig(hop_k=3, max_hops=1)
    loop = EfficientRAGLoop(lab, fil, retriever, cfg)
    titled = loop.run(questions[:2])
    loop.config = cfg.replace(chunk_format="text")
    text_only = loop.run(questions[:2])
    fresh = EfficientRAGLoop(lab, fil, retriever, cfg.replace(chunk_format="text")).run(questions[:2])
    assert [[c.kept_words for c in r.chunks] for r in text_only] == [[c.kept_words for c in r.chunks] for r in fresh]
    c = text_only[0].chunks[0]
    assert c.kept_words == words(c.text)  # every word kept: exactly the text's
    assert titled[0].chunks[0].kept_words == words(chunk_text(c.title, c.text))


def test_a_corpus_over_the_cap_is_left_to_the_questions(models, retriever, questions, monkeypatch):
    """Which part of a corpus larger than PREPARED_CHUNKS the questions read is unknown: nothing is prepared, and
    passages given explicitly are prepared up to the cap."""
    import effrag.pipelines.efficientrag.loop as loop_module

    monkeypatch.setattr(loop_module, "PREPARED_CHUNKS", len(retriever.corpus) - 1)
    lab, fil = fixed_heads(models, tag=+20)
    loop = EfficientRAGLoop(lab, fil, retriever, EfficientRAGConfig(hop_k=3, max_hops=1))
    assert loop.prepare()["passages"] == 0
    assert loop.prepare(list(retriever.corpus))["passages"] == len(retriever.corpus) - 1
    assert loop.run(questions[:1])[0].chunks
