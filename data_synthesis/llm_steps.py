"""EfficientRAG's LLM-driven synthesis steps (paper §3.2, prompts of Appendix B.2).

For one question with its gold chunks:

1. **decomposition** - the LLM splits the question into one sub-question per
   gold chunk (document ``#i`` = gold chunk ``i``), with answers and
   dependencies. Sub-questions are grouped into hops: a sub-question's hop is
   one more than the latest hop it depends on.
2. **token labeling** - for each sub-question the LLM extracts the chunk words
   needed to answer it; :func:`data_synthesis.align.align_words` turns them into
   one binary label per chunk word.
3. **next-hop filtering** - from the current query and the kept words of the
   chunks found at this hop (``"<query> Info: <kept words> Info: ..."``) the LLM
   picks the words of the next-hop query; aligned back, they are the Filter's
   labels, and their concatenation is the query the Labeler sees at the next hop.

Every LLM answer is validated; a failed step is retried with another seed and
a higher temperature, and after ``max_retries`` retries the question is
rejected with :class:`SynthesisReject` naming the step and why (also when
the backend refuses the request itself, e.g. a prompt longer than the context).
Other backend failures (:class:`~effrag.llm.LLMError`, e.g. a server that is
down) propagate: they are not the question's fault.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from effrag.data.records import Passage, Question
from effrag.llm import LLM, JSONParseError, LLMRequestError, parse_json_loose
from effrag.prompts import load_prompt
from effrag.text import INFO, filter_input_words, join_words, passage_text, words

from .align import align, content_keys

SOURCE = "llm"
USER_MESSAGES = "efficientrag/user_messages"  # the templates of the steps' user messages (prompt data)
COMPARISON_TYPES = {"comparison"}  # sub-questions independent of each other (HotpotQA / 2Wiki "comparison")
_NORM = re.compile(r"[^0-9a-z]+")


class SynthesisReject(Exception):
    """The LLM's output for this question stayed invalid; ``reason`` is a short code for stats."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class _Invalid(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass
class LLMStepsConfig:
    """Thresholds and budgets of the LLM steps (saved beside the outputs by the caller)."""

    max_retries: int = 2
    seed: int = 0
    retry_temperature: float = 0.7
    min_coverage: float = 0.8  # share of LLM-picked words that must be found in the source words
    max_label_fraction: float = 0.6  # more than this labelled in a chunk of >= 20 words = "copied everything"
    require_answer_words: bool = True  # token labels must keep at least half of the sub-answer's words
    require_question_words: bool = True  # ... and a content word of the sub-question, when the chunk has one
    max_tokens_decompose_per_hop: int = 90
    max_tokens_label: int = 160
    max_tokens_filter: int = 96


# ------------------------------------------------------------------ word normalisation

def _norm(w: str) -> str:
    return _NORM.sub("", w.lower())


def _align(source: list[str], picked: list[str]) -> tuple[list[int], float]:
    """Labels over ``source`` for the LLM-picked words, and the share of picked words found."""
    report = align(source, picked)
    if len(report.labels) != len(source):
        raise RuntimeError(f"align returned {len(report.labels)} labels for {len(source)} words")
    return [int(bool(x)) for x in report.labels], report.fraction


def _share_found(needle: str, hay: list[str]) -> float:
    want = [_norm(w) for w in words(needle) if _norm(w)]
    have = {_norm(w) for w in hay}
    return sum(w in have for w in want) / len(want) if want else 0.0


# ------------------------------------------------------------------ one validated LLM step

def _run_step(step: str, llm: LLM, messages: list[dict[str, str]], schema: dict[str, Any], max_tokens: int,
              validate: Callable[[dict[str, Any]], Any], cfg: LLMStepsConfig) -> Any:
    """Ask, parse, validate; retry with new seeds; reject with the last failure's reason."""
    failures: list[str] = []
    reason = f"{step}_failed"
    for attempt in range(cfg.max_retries + 1):
        temperature = 0.0 if attempt == 0 else cfg.retry_temperature
        try:
            comp = llm.chat(messages, temperature=temperature, max_tokens=max_tokens, json_schema=schema,
                            seed=cfg.seed + attempt)[0]
        except LLMRequestError as e:  # e.g. the prompt does not fit the context: retrying will not help
            raise SynthesisReject(f"{step}_request_rejected", str(e)[:300]) from None
        try:
            try:
                data = parse_json_loose(comp.text)
            except JSONParseError as e:
                truncated = comp.finish_reason == "length"
                raise _Invalid(f"{step}_{'truncated' if truncated else 'bad_json'}", str(e)) from None
            return validate(data)
        except _Invalid as e:
            reason = e.reason
            failures.append(f"[{attempt}] {e.reason}: {e.detail}"[:300])
    raise SynthesisReject(reason, " | ".join(failures))


def _get_str(data: dict[str, Any], key: str, step: str) -> str:
    v = data.get(key)
    if not isinstance(v, str) or not v.strip():
        raise _Invalid(f"{step}_missing_field", f"no non-empty string {key!r} in {str(data)[:120]}")
    return v.strip()


# ------------------------------------------------------------------ 1. decomposition

@dataclass
class SubQ:
    question: str
    answer: str
    chunk: int  # index into Question.gold
    dependencies: list[int]  # indices of other SubQ
    hop: int = 0  # 0-based


def decomposition_schema(k: int, comparison: bool) -> dict[str, Any]:
    """JSON schema of the paper's decomposition format, bounded for small models."""
    ids = [str(i + 1) for i in range(k)]
    props = {}
    for sid in ids:
        props[sid] = {
            "type": "object",
            "properties": {
                "sub_question": {"type": "string", "minLength": 5, "maxLength": 200},
                "answer": {"type": "string", "minLength": 1, "maxLength": 80},
                "dependency": {"type": "array", "items": {"type": "string", "enum": [x for x in ids if x != sid] or ["0"]},
                               "maxItems": 0 if comparison else max(k - 1, 0)},
                # "Each document infers a sub_question id": sub-question i is answered by document #i
                "document": {"type": "string", "enum": [f"#{sid}"]},
            },
            "required": ["sub_question", "answer", "dependency", "document"],
            "additionalProperties": False,
        }
    return {
        "type": "object",
        "properties": {
            "question": {"type": "string", "maxLength": 400},
            "decomposed_questions": {"type": "object", "properties": props, "required": ids,
                                     "additionalProperties": False},
        },
        "required": ["question", "decomposed_questions"],
        "additionalProperties": False,
    }


def decomposition_messages(q: Question) -> list[dict[str, str]]:
    comparison = (q.type or "") in COMPARISON_TYPES
    system = load_prompt("efficientrag/decomposition" if comparison else "efficientrag/decomposition_compose")
    um = load_prompt(USER_MESSAGES)
    documents = []
    for i, p in enumerate(q.gold):
        documents.append(um.fill("document", number=i + 1, text=passage_text(p)))
        for s, r, o in q.evidences:  # 2Wiki triples, shown under the document about their subject
            if _norm(s) == _norm(p.title):
                documents.append(um.fill("evidence", subject=s, relation=r, object=o))
    user = um.fill("decomposition", question=q.question, answer=q.answer, documents="".join(documents))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _validate_decomposition(q: Question, data: dict[str, Any]) -> list[SubQ]:
    k = len(q.gold)
    dq = data.get("decomposed_questions")
    if isinstance(dq, list):  # tolerated: a list in document order instead of a numbered dict
        dq = {str(i + 1): v for i, v in enumerate(dq)}
    if not isinstance(dq, dict) or len(dq) != k:
        raise _Invalid("decompose_wrong_count", f"expected {k} sub-questions, got {str(dq)[:120]}")
    keys = sorted(dq, key=lambda s: (len(s), s))
    pos = {key: i for i, key in enumerate(keys)}
    subs: list[SubQ] = []
    for key in keys:
        item = dq[key]
        if not isinstance(item, dict):
            raise _Invalid("decompose_missing_field", f"sub-question {key} is not an object")
        sq, ans = _get_str(item, "sub_question", "decompose"), _get_str(item, "answer", "decompose")
        doc = str(item.get("document", f"#{key}")).strip().lstrip("#")
        if not doc.isdigit() or not 1 <= int(doc) <= k:
            raise _Invalid("decompose_bad_document", f"sub-question {key} cites document {item.get('document')!r}")
        deps = item.get("dependency") or []
        if isinstance(deps, (str, int)):
            deps = [deps]
        dep_idx = []
        for d in deps:
            d = str(d).strip().lstrip("#")
            if d not in pos or d == key:
                raise _Invalid("decompose_bad_dependency", f"sub-question {key} depends on {d!r}")
            dep_idx.append(pos[d])
        subs.append(SubQ(sq, ans, int(doc) - 1, sorted(set(dep_idx))))
    if sorted(s.chunk for s in subs) != list(range(k)):
        raise _Invalid("decompose_document_mismatch", f"documents cited: {[s.chunk + 1 for s in subs]}")
    for s in subs:
        if k > 1 and _norm(s.question) == _norm(q.question):
            raise _Invalid("decompose_copied_question", s.question)
        if _share_found(s.answer, words(passage_text(q.gold[s.chunk]))) < 0.5:
            raise _Invalid("decompose_answer_not_in_document", f"{s.answer!r} not in document #{s.chunk + 1}")
    _assign_hops(subs)
    comparison = (q.type or "") in COMPARISON_TYPES
    if comparison and any(s.dependencies for s in subs):
        raise _Invalid("decompose_bad_dependency", "a comparison's sub-questions must not depend on each other")
    if k > 1 and not comparison and not any(s.dependencies for s in subs):
        raise _Invalid("decompose_no_dependency", "no sub-question depends on another")
    return subs


def _assign_hops(subs: list[SubQ]) -> None:
    """hop = 1 + the latest hop among dependencies (0 without); a cycle is invalid."""
    state: dict[int, int] = {}

    def visit(i: int) -> int:
        if state.get(i) == -1:
            raise _Invalid("decompose_bad_dependency", "dependency cycle")
        if i not in state:
            state[i] = -1
            state[i] = 1 + max((visit(d) for d in subs[i].dependencies), default=-1)
        return state[i]

    for i, s in enumerate(subs):
        s.hop = visit(i)


def decompose(q: Question, llm: LLM, cfg: LLMStepsConfig) -> list[SubQ]:
    comparison = (q.type or "") in COMPARISON_TYPES
    return _run_step("decompose", llm, decomposition_messages(q), decomposition_schema(len(q.gold), comparison),
                     cfg.max_tokens_decompose_per_hop * len(q.gold) + 60,
                     lambda d: _validate_decomposition(q, d), cfg)


# ------------------------------------------------------------------ 2. token labeling

def labeling_messages(sub: SubQ, p: Passage) -> list[dict[str, str]]:
    user = load_prompt(USER_MESSAGES).fill("token_labeling", question=sub.question, paragraph=passage_text(p),
                                           answer=sub.answer)
    return [{"role": "system", "content": load_prompt("efficientrag/token_labeling")},
            {"role": "user", "content": user}]


def label_chunk(sub: SubQ, p: Passage, llm: LLM, cfg: LLMStepsConfig) -> list[int]:
    """Binary labels over ``words(passage_text(p))`` for the words the LLM kept to answer ``sub``."""
    cw = words(passage_text(p))
    schema = {"type": "object", "properties": {"extracted_words": {
        "type": "string", "minLength": 1, "maxLength": min(len(passage_text(p)), 400)}},
        "required": ["extracted_words"], "additionalProperties": False}

    def validate(data: dict[str, Any]) -> list[int]:
        picked = words(_get_str(data, "extracted_words", "label"))
        labels, cov = _align(cw, picked)
        if not any(labels):
            raise _Invalid("label_empty", f"no extracted word found in the chunk: {join_words(picked)[:120]!r}")
        if cov < cfg.min_coverage:
            raise _Invalid("label_low_coverage", f"{cov:.2f} of extracted words found in the chunk")
        if len(cw) >= 20 and sum(labels) > cfg.max_label_fraction * len(cw):
            raise _Invalid("label_everything", f"{sum(labels)}/{len(cw)} words labelled")
        kept = [w for w, l in zip(cw, labels) if l]
        if cfg.require_answer_words and _share_found(sub.answer, kept) < 0.5:
            raise _Invalid("label_missing_answer", f"answer {sub.answer!r} not among the labelled words")
        asked = (content_keys(words(sub.question)) & content_keys(cw)) - content_keys(words(sub.answer))
        if cfg.require_question_words and asked and not asked & content_keys(kept):
            raise _Invalid("label_missing_question", f"none of {sorted(asked)[:6]} labelled")
        return labels

    return _run_step("label", llm, labeling_messages(sub, p), schema, cfg.max_tokens_label, validate, cfg)


# ------------------------------------------------------------------ 3. next-hop filtering

def filtering_messages(query: str, kept: list[list[str]]) -> list[dict[str, str]]:
    um = load_prompt(USER_MESSAGES)
    user = um.fill("query_filtering", question=query, info="".join(um.fill("info", kept=join_words(k)) for k in kept))
    return [{"role": "system", "content": load_prompt("efficientrag/query_filtering")},
            {"role": "user", "content": user}]


def filter_next_query(query: str, kept: list[list[str]], llm: LLM, cfg: LLMStepsConfig) -> list[int]:
    """Labels over :func:`filter_input_words` marking the next-hop query the LLM picked."""
    src = filter_input_words(query, kept)
    n_query = len(words(query))
    markers = {i for i in range(n_query, len(src)) if src[i : i + 2] == INFO}
    markers |= {i + 1 for i in markers}
    schema = {"type": "object", "properties": {"filtered_query": {
        "type": "string", "minLength": 1, "maxLength": min(len(join_words(src)), 300)}},
        "required": ["filtered_query"], "additionalProperties": False}

    def validate(data: dict[str, Any]) -> list[int]:
        picked = words(_get_str(data, "filtered_query", "filter"))
        raw, cov = _align(src, picked)
        labels = [0 if i in markers else l for i, l in enumerate(raw)]
        if cov < cfg.min_coverage:
            raise _Invalid("filter_low_coverage", f"{cov:.2f} of query words found in the input")
        if not any(labels[n_query:]):
            raise _Invalid("filter_no_info_words", f"next-hop query keeps no known info: {join_words(picked)!r}")
        if not any(labels[:n_query]):
            raise _Invalid("filter_no_question_words", f"next-hop query drops the whole question: {join_words(picked)!r}")
        return labels

    return _run_step("filter", llm, filtering_messages(query, kept), schema, cfg.max_tokens_filter, validate, cfg)


# ------------------------------------------------------------------ the question-level entry point

def synthesize_question_llm(question: Question, llm: LLM, *, max_retries: int = 2,
                            config: LLMStepsConfig | None = None) -> tuple[list[dict], list[dict]]:
    """Labeler and Filter records (formats of docs/design.md, ``source="llm"``) for one question.

    Labeler records: one per gold chunk, at the hop its sub-question belongs to
    (1-based), ``tag=1``; the query is the original question at hop 1 and the
    filtered next-hop query later. Filter records: one per hop transition.
    Hard negatives are added later by the negatives step. Raises
    :class:`SynthesisReject` when the LLM output stays invalid.
    """
    cfg = config or LLMStepsConfig(max_retries=max_retries)
    if not question.gold:
        raise SynthesisReject("no_gold", f"question {question.id} has no gold chunks")
    subs = decompose(question, llm, cfg)
    labels = [label_chunk(s, question.gold[s.chunk], llm, cfg) for s in subs]
    base = {"qid": question.id, "dataset": question.dataset, "source": SOURCE}
    lab_recs: list[dict] = []
    filt_recs: list[dict] = []
    query = question.question
    n_hops = 1 + max(s.hop for s in subs)
    for hop in range(n_hops):
        at_hop = [i for i, s in enumerate(subs) if s.hop == hop]
        kept = []
        for i in at_hop:
            p = question.gold[subs[i].chunk]
            cw = words(passage_text(p))
            lab_recs.append({**base, "hop": hop + 1, "query": query, "chunk_id": p.id,
                             "chunk_words": cw, "labels": labels[i], "tag": 1})
            kept.append([w for w, l in zip(cw, labels[i]) if l])
        if hop + 1 < n_hops:
            flabels = filter_next_query(query, kept, llm, cfg)
            src = filter_input_words(query, kept)
            target = join_words([w for w, l in zip(src, flabels) if l])
            filt_recs.append({**base, "hop": hop + 1, "words": src, "labels": flabels, "target": target})
            query = target
    return lab_recs, filt_recs
