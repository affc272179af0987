"""Hard negatives for the Labeler's <Terminate> tag (paper §3.2, "Negative Sampling").

Every query the Labeler will see - the question at hop 1 and each Filter target at
the hop after it - is searched with the foundation retriever; the best hit that is
not a gold chunk becomes a Labeler record with ``tag=0`` and all-zero labels. A hit
is "gold" if its id is a gold id *or* its title is a gold title (the same article
under another id, e.g. a differently whitespaced copy from another dataset file),
so that a near-duplicate of the gold chunk is never taught as irrelevant. With ``skip_answer``
(``effrag synthesize --skip-answer-negatives``) a hit that states the question's answer (any alias, as whole
words; yes/no answers excepted) is passed over too: a passage from elsewhere that holds the answer may be another
support for it. In the pooled train data of the shipped recipe (2026-11-25) about 4% of the dense negatives were
such hits (366 of 8,497; MuSiQue: 7% of its hop-2 negatives state the hop-2 answer). Off by default: a recipe run
with it tuned to the same dev recall (reports/efficientrag/labeler-2ep).

Searches are batched over many questions: one ``retriever.search`` call per batch.

:func:`context_negatives` adds a second kind, with no search: the question's own distractor
paragraphs (the non-gold paragraphs its dataset lists with it, chosen by the dataset's authors to
look relevant), hardest first, as ``tag=0`` records under the question. They teach the <Continue> tag
to rank: a retriever's best miss is one paragraph per query, while the loop's pool is cut from the
20-50 chunks it reads, most of them of exactly this kind.
"""
from __future__ import annotations

from collections.abc import Sequence

from effrag.data.records import Question, normalize_space
from effrag.retrieval.base import Retriever
from effrag.text import chunk_text, normalize_answer, words


def negative_queries(question: Question, filter_records: Sequence[dict]) -> list[tuple[int, str]]:
    """(hop, query) pairs to mine negatives for: the question at hop 1, each Filter target after."""
    out: list[tuple[int, str]] = [(1, question.question)]
    for f in filter_records:
        out.append((int(f["hop"]) + 1, f["target"]))
    seen: set[str] = set()
    return [(h, q) for h, q in out if q.strip() and not (q in seen or seen.add(q))]


def _title_key(title: str) -> str:
    return normalize_space(title).casefold()


def _answer_patterns(q: Question) -> list[str]:
    """The question's answers as normalised word strings (" a b "), without yes/no: what a negative must not state."""
    return [f" {norm} " for norm in map(normalize_answer, q.answers) if norm and norm not in ("yes", "no", "noanswer")]


def states_answer(text: str, patterns: Sequence[str]) -> bool:
    """Whether ``text`` contains one of :func:`_answer_patterns`' answers as whole words."""
    if not patterns:
        return False
    padded = f" {normalize_answer(text)} "
    return any(p in padded for p in patterns)


def _negative_record(q: Question, hop: int, query: str, chunk_id: str, cw: list[str], source: str) -> dict:
    return {"qid": q.id, "dataset": q.dataset, "hop": hop, "query": query, "chunk_id": chunk_id,
            "chunk_words": cw, "labels": [0] * len(cw), "tag": 0, "source": source}


def context_negatives(question: Question, n: int, *, exclude: set[str] = frozenset(),
                      source: str = "annotation") -> list[dict]:
    """Up to ``n`` of ``question``'s own non-gold context paragraphs as negative records at hop 1.

    Hardest first: most content words shared with the question, then context order (deterministic).
    A paragraph with a gold title (another copy of a gold article) or an id in ``exclude`` (already a
    negative of this question) is skipped.
    """
    from .align import content_keys

    if n < 1:
        return []
    gold_ids = set(question.gold_ids)
    gold_titles = {_title_key(p.title) for p in question.gold}
    qkeys = content_keys(words(question.question))
    cands = []
    for i, p in enumerate(question.contexts):
        if p.id in gold_ids or p.id in exclude or _title_key(p.title) in gold_titles:
            continue
        cw = words(chunk_text(p.title, p.text))
        cands.append((-len(qkeys & content_keys(cw)), i, p.id, cw))
    return [_negative_record(question, 1, question.question, pid, cw, source)
            for _, _, pid, cw in sorted(cands)[:n]]


def mine_negatives(items: Sequence[tuple[Question, Sequence[dict]]], retriever: Retriever, *,
                   k: int = 10, per_query: int = 1, source: str = "annotation",
                   skip_answer: bool = False) -> list[list[dict]]:
    """Negative Labeler records for each ``(question, filter_records)`` item, in item order.

    ``per_query`` negatives are taken per query, best-ranked first; a query whose top
    ``k`` hits are all gold (or, with ``skip_answer``, state the answer) gets none.
    """
    if per_query < 1 or k < per_query:
        raise ValueError(f"need 1 <= per_query <= k, got per_query={per_query}, k={k}")
    plan: list[tuple[int, int, str]] = []  # (item index, hop, query)
    for n, (q, filters) in enumerate(items):
        plan.extend((n, hop, query) for hop, query in negative_queries(q, filters))
    hits = retriever.search([query for _, _, query in plan], k) if plan else []
    out: list[list[dict]] = [[] for _ in items]
    word_cache: dict[str, list[str]] = {}
    for (n, hop, query), ranked in zip(plan, hits):
        q = items[n][0]
        gold_ids = set(q.gold_ids)
        gold_titles = {_title_key(p.title) for p in q.gold}
        answers = _answer_patterns(q) if skip_answer else []
        taken = 0
        for h in ranked:
            if h.id in gold_ids or _title_key(h.title) in gold_titles or states_answer(f"{h.title} {h.text}", answers):
                continue
            if h.id not in word_cache:
                word_cache[h.id] = words(chunk_text(h.title, h.text))
            cw = word_cache[h.id]
            out[n].append(_negative_record(q, hop, query, h.id, cw, source))
            taken += 1
            if taken == per_query:
                break
    return out
