"""Each dataset's annotation as sub-question steps (annotation-derived records, :mod:`.annotation`).

* MuSiQue: steps from ``question_decomposition``; ``#k`` is replaced by hop k's answer
  and ``"X >> relation"`` becomes ``"relation of X"``, giving standalone sub-questions.
  Kept words are chunk words in the evidence sentences (those holding the answer, plus the
  one overlapping the sub-question most) that match the sub-question's content words or
  the answer; occurrences of the whole answer phrase are kept with their stop words.
* 2WikiMQA: one step per ``evidences`` triple (subject, relation, object), mapped to the
  gold passage about its subject; a triple whose subject is an earlier triple's object
  depends on it. Kept words: supporting-sentence words matching subject, object or
  relation (shared 4+ char prefix). Sub-question: "What is the <relation> of <subject>?".
* HotpotQA: kept words are the supporting-sentence words matching the question's content
  words or the answer, plus the whole title. Bridge: hop 1 is the gold passage whose title
  is in the question, else the one naming the other's title, else the one without the
  answer; the bridge entity (hop 1's "answer") is the hop-2 title if hop 1 names it (kept
  wherever it occurs in the hop-1 chunk), else hop 1's own title. Comparison: both hop 1.

A step's hop is 1 + the latest hop it depends on, so independent steps (comparisons,
MuSiQue's parallel branches) are all hop 1, retrieved by the question, as at inference.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from effrag.data.records import Question

from .align import key_matches
from .chunk_labels import ChunkView, text_keys

_REF = re.compile(r"#(\d+)")
_PAREN = re.compile(r"\s*\([^)]*\)\s*$")


class AnnotationReject(Exception):
    """The question's annotation cannot give records; ``reason`` is a short code for stats."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass
class Step:
    """One sub-question: the gold chunk answering it, its answer, the steps it needs."""

    chunk: int
    question: str
    answer: str
    deps: list[int]
    keys: set[str]  # content-word keys deciding which query words this step answers
    labels: list[int] = field(default_factory=list)
    hop: int = 1



def _clean_title(title: str) -> str:
    return _PAREN.sub("", title).strip()


def _musique_steps(q: Question, views: list[ChunkView]) -> list[Step]:
    if not q.decomposition:
        raise AnnotationReject("no_decomposition")
    steps: list[Step] = []
    qk = text_keys(q.question)
    for i, sq in enumerate(q.decomposition):
        if sq.passage is None:
            raise AnnotationReject("no_supporting_paragraph", f"sub-question {i + 1}")
        text = sq.question
        if ">>" in text:
            left, right = text.split(">>", 1)
            text = f"{right.strip()} of {left.strip()}"
        text = _REF.sub(lambda m: steps[int(m.group(1)) - 1].answer if int(m.group(1)) <= len(steps)
                        else m.group(0), text)
        view = views[sq.passage]
        # question words naming the chunk's title entity belong to this hop ("Dai Jitao" for
        # a sub-question that spells it "Tai Chi-tao")
        keys = text_keys(text) | {k for k in qk if key_matches(k, text_keys(view.passage.title))}
        ans = text_keys(sq.answer)
        with_answer = view.sentences_with(ans, 1.0) or view.sentences_with(ans, 0.5)
        sents = view.best_sentence(keys, among=with_answer) | view.best_sentence(keys)
        step = Step(sq.passage, text, sq.answer, list(sq.dependencies), keys)
        step.labels = view.label(keys | ans, [sq.answer], sents or None)
        steps.append(step)
    return steps


def _evidence_to_gold(q: Question, views: list[ChunkView]) -> list[int]:
    """Gold index of each triple: the passage whose title best matches its subject."""
    out: list[int] = []
    for t, (subj, _rel, obj) in enumerate(q.evidences):
        sk, ok = text_keys(subj), text_keys(obj)
        best, best_score = None, 0.0
        for g, v in enumerate(views):
            tk = text_keys(v.passage.title)
            score = 2 * len(sk & tk) / max(1, len(sk | tk))
            score += 0.5 * bool(v.sentences_with(ok)) + 0.25 * bool(v.sentences_with(sk))
            score += 0.3 * (g not in out) + 0.2 * (g == t)  # one triple per passage, in order
            if score > best_score:
                best, best_score = g, score
        if best is None or best_score < 0.5:
            best = t if t < len(views) else None
        if best is None:
            raise AnnotationReject("evidence_not_mapped", f"triple {t + 1} {subj!r}")
        out.append(best)
    return out


def _2wiki_steps(q: Question, views: list[ChunkView]) -> list[Step]:
    if not q.evidences:
        raise AnnotationReject("no_evidences")
    gold_of = _evidence_to_gold(q, views)
    chained = (q.type or "") in ("compositional", "inference")
    steps: list[Step] = []
    for j, (subj, rel, obj) in enumerate(q.evidences):
        sk = text_keys(subj)
        deps = [i for i in range(j)
                if sk and (sk <= text_keys(q.evidences[i][2]) or text_keys(q.evidences[i][2]) <= sk)]
        if not deps and j > 0 and chained:
            deps = [j - 1]
        if not deps and (q.type or "") == "bridge_comparison" and j >= 2:
            deps = [j - 2]
        view = views[gold_of[j]]
        sup = set((q.supporting_sentences or [[]] * len(views))[gold_of[j]])
        keys = sk | text_keys(rel)
        with_obj = view.sentences_with(text_keys(obj), 1.0)
        if sup and with_obj and not sup & with_obj:  # a known 2Wiki slip: the object's sentence
            sup |= view.best_sentence(keys, among=with_obj)  # is not listed as supporting
        step = Step(gold_of[j], f"What is the {rel} of {subj}?", obj, deps, keys)
        step.labels = view.label(keys | text_keys(obj), [subj, obj], sup or None)
        steps.append(step)
    return steps


def _hotpot_steps(q: Question, views: list[ChunkView]) -> list[Step]:
    qk, ak = text_keys(q.question), text_keys(q.answer)
    sup = q.supporting_sentences or [[] for _ in views]

    def label(g: int, extra: set[str], anywhere: list[str]) -> list[int]:
        return views[g].label(qk | ak | extra, [q.answer], set(sup[g]) or None, whole_title=True,
                              anywhere=anywhere)

    def kept_keys(g: int, labels: list[int]) -> set[str]:
        return {k for k, l in zip(views[g].keys, labels) if l}

    if (q.type or "") == "comparison" or len(views) < 2:
        steps = []
        for g in range(len(views)):
            labels = label(g, set(), [])
            entity = {k for k in qk if key_matches(k, text_keys(views[g].passage.title))}
            steps.append(Step(g, "", "", [], entity or {k for k in qk if key_matches(k, kept_keys(g, labels))},
                              labels))
        return steps
    titles = [_clean_title(v.passage.title) for v in views[:2]]
    in_q = [len(text_keys(t) & qk) / max(1, len(text_keys(t))) >= 0.5 for t in titles]
    mentions = [bool(views[g].sentences_with(text_keys(titles[1 - g]))) for g in range(2)]  # g names the other
    has_answer = [bool(views[g].sentences_with(ak)) for g in range(2)]
    first = 0
    for rule in (in_q, mentions, [not x for x in has_answer]):  # first rule that tells them apart
        if rule[0] != rule[1]:
            first = 0 if rule[0] else 1
            break
    second = 1 - first
    # the bridge entity: hop 2's title named in hop 1, else hop 1's own title (named in hop 2)
    bridge = titles[second] if mentions[first] else titles[first]
    l1 = label(first, text_keys(bridge), [bridge])
    l2 = label(second, set(), [])
    k1 = {k for k in qk if key_matches(k, kept_keys(first, l1))}
    k2 = {k for k in qk if key_matches(k, kept_keys(second, l2))} | (qk - k1)
    steps = [Step(first, "", bridge, [], k1, l1), Step(second, "", q.answer, [0], k2, l2)]
    steps += [Step(g, "", "", [], set(), label(g, set(), [])) for g in range(2, len(views))]
    return steps


STEPS = {"musique": _musique_steps, "2wikimqa": _2wiki_steps, "hotpotqa": _hotpot_steps}


def assign_hops(steps: list[Step]) -> None:
    for s in steps:  # dependencies always point backwards, so one pass suffices
        s.hop = 1 + max((steps[d].hop for d in s.deps), default=0)
