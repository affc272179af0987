"""The pool's link bonus (``link_weight``, ``backlink_weight``, ``link_top``): a chunk named by, or naming, one of
the best chunks moves up; nothing else about the pool changes."""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

from effrag.models import FilterModel, LabelerModel, RankerModel
from effrag.pipelines.efficientrag import EfficientRAGConfig, EfficientRAGLoop
from effrag.pipelines.efficientrag.pool import rank_pool
from effrag.pipelines.result import Chunk
from effrag.text import link_form, link_title


def test_titles_are_looked_up_as_whole_words_without_their_disambiguation():
    assert link_title("Tom Smith (footballer)") == "tom smith"
    assert link_title("Ed") == "" and link_title("U2 (band)") == ""  # too short to be a name rather than a word
    text = link_form("He played for Arsenal F.C., then for Tom-Smith's club.")
    assert " arsenal f c " in text and " tom smith s " in text
    assert f" {link_title('Arsenal')} " in text and f" {link_title('Arsen')} " not in text


def _state(chunks):
    return SimpleNamespace(question="q", pool=list(chunks), rejected=[], rescores={}, requeries=[],
                           timing={}, trace=[], iterations=1, link_forms={})


def _chunk(cid, title, text, logit):
    return Chunk(id=cid, title=title, text=text, score=0.5, hop=0, retrieval_rank=0, rank_score=logit,
                 retrieval_score=0.0)


def _ids(chunks, **cfg):
    config = EfficientRAGConfig(pool_order="rank", pool_source="seen", retrieval_weight=0.0, **cfg)
    return [c.id for c in rank_pool(_state(chunks), config).chunks]


def test_a_chunk_the_best_chunk_names_moves_up_by_link_weight():
    chunks = [_chunk("a", "Film X", "Film X was directed by Jane Doe in 1990.", 5.0),
              _chunk("c", "Other Film", "Another film, unrelated.", 2.0),
              _chunk("b", "Jane Doe (director)", "Jane Doe is an American director.", 1.5)]
    assert _ids(chunks) == ["a", "c", "b"]
    assert _ids(chunks, link_weight=1.0, link_top=1) == ["a", "b", "c"]  # 1.5 + 1 > 2
    assert _ids(chunks, link_weight=0.4, link_top=1) == ["a", "c", "b"]  # 1.5 + 0.4 < 2
    # backlink: a chunk whose text names the best chunk's title
    chunks = [_chunk("a", "Film X", "Film X is a 1990 drama.", 5.0),
              _chunk("c", "Other Film", "Another film, unrelated.", 1.0),
              _chunk("b", "Jane Doe", "Jane Doe directed Film X.", 0.5)]
    assert _ids(chunks, backlink_weight=1.0, link_top=1) == ["a", "b", "c"]
    assert _ids(chunks, link_weight=1.0, link_top=1) == ["a", "c", "b"]  # a's text does not name "Jane Doe" now


def test_only_the_link_top_best_chunks_lend_a_bonus_and_a_chunk_counts_once():
    chunks = [_chunk("a", "Alpha One", "Nothing to see.", 5.0),
              _chunk("b", "Beta Two", "Mentions Delta Four and Delta Four again.", 4.0),
              _chunk("c", "Gamma Three", "Mentions Delta Four too.", 3.0),
              _chunk("d", "Delta Four", "Plain text.", 0.0)]
    assert _ids(chunks, link_weight=2.5, link_top=1) == ["a", "b", "c", "d"]  # the best chunk names nothing
    assert _ids(chunks, link_weight=3.5, link_top=2) == ["a", "b", "d", "c"]  # b names d: 0 + 3.5 > 3
    assert _ids(chunks, link_weight=2.5, link_top=3) == ["a", "b", "c", "d"]  # b and c name d: 2.5 once, < 3


def test_link_options_need_the_rank_order_and_non_negative_weights():
    with pytest.raises(ValueError, match="link_weight needs pool_order rank"):
        EfficientRAGConfig(pool_order="fused", link_weight=1.0)
    with pytest.raises(ValueError, match="backlink_weight must be a number >= 0"):
        EfficientRAGConfig(pool_order="rank", backlink_weight=-1.0)
    with pytest.raises(ValueError, match="link_top must be an integer >= 1"):
        EfficientRAGConfig(pool_order="rank", link_top=0)
    assert "link_weight" not in EfficientRAGConfig(pool_order="rank").to_json()  # old configs still match


def _mentions(text, title):
    name = re.sub(r"\s*\([^()]*\)\s*$", "", title).lower()
    name = " ".join(re.sub(r"[^0-9a-z]+", " ", name).split())
    return len(name) >= 4 and f" {name} " in " " + " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split()) + " "


def test_the_loop_over_real_models_orders_its_pool_by_relevance_plus_link_bonus(tiny_efficientrag_dirs, hotpot, retriever):
    d = tiny_efficientrag_dirs  # hotpot, retriever: BM25 over the bundled questions' contexts (conftest.py)
    lab, fil, rank = (LabelerModel.from_pretrained(d["labeler"]).eval(), FilterModel.from_pretrained(d["filter"]).eval(),
                      RankerModel.from_pretrained(d["ranker"]).eval())
    cfg = dict(hop_k=4, first_hop_k=8, max_hops=2, tag_threshold=0.0, pool_source="seen", pool_order="rank",
               retrieval_weight=1.0)
    qs = [q.question for q in hotpot[:6]]
    plain = EfficientRAGLoop(lab, fil, retriever, EfficientRAGConfig(**cfg), ranker=rank)
    states = plain.run_states(qs)
    linked_cfg = EfficientRAGConfig(**cfg, link_weight=2.0, backlink_weight=1.0, link_top=3)
    moved = 0
    for before, after in zip(plain.rank_pools(states), plain.rank_pools(states, linked_cfg)):
        assert sorted(before.ids) == sorted(after.ids)  # the same chunks: the bonus orders, never adds
        base = {c.id: c.rank_score - math.log1p(c.retrieval_rank) for c in before.chunks}
        top = before.chunks[:3]
        key = {c.id: base[c.id]
               + 2.0 * any(_mentions(t.text, c.title) for t in top if t.id != c.id)
               + 1.0 * any(_mentions(c.text, t.title) for t in top if t.id != c.id) for c in before.chunks}
        keys = [key[c] for c in after.ids]
        assert keys == pytest.approx(sorted(keys, reverse=True))
        moved += before.ids != after.ids
    assert moved  # the sample's bridge paragraphs name each other: some pool must change order
