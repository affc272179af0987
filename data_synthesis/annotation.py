"""Annotation-derived training data (no LLM): EfficientRAG records from the datasets' own labels.

Each question becomes a list of :class:`Step` (one sub-question per gold chunk, with
its answer and dependencies); the generic part then emits records exactly as the
LLM path does (``data_synthesis.llm_steps``: hops 1-based, chunk words of
``"<title>: <text>"``, Filter input ``"<query> Info: <kept> Info: <kept>..."``):

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

Records per question:

* Labeler, tag 1: each gold chunk with the current query of its hop (the question at
  hop 1, the previous Filter target later), and again with the original question at
  hops >= 2 (at inference the Labeler also sees those chunks under the question).
* Filter, at each hop before the last: input = current query + kept words of that
  hop's chunks; labels = the query's words that are not yet answered (see
  :func:`next_query_labels`) + the bridge entities (answers found at this hop that a
  remaining step depends on) located in the Info words. target = the labeled words joined.
* Comparison / parallel hops (>= 2 chunks at one hop): no Filter record for the full
  info when nothing remains (inference stops on <Terminate> tags, learnt from the
  negatives), but one "partial" record per chunk: info of that chunk only -> a query
  for what is still missing (the other entity + compared attribute), mirroring an
  inference step that retrieved only one side. Its target is also used as the Labeler
  query of the chunks it asks for.

A Filter record whose bridge is not in its Info words is rejected (stage "filter"),
the question's other records are kept. Problems that lose no record are counted in
``notes`` (e.g. ``answer_not_in_chunk``).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from effrag.data.records import Passage, Question
from effrag.text import join_words, words

from .align import (WH_WORDS, align, content_keys, is_content, is_punct, key_matches,
                    normalize_chars, word_key)
from effrag.text import INFO, filter_input_words, passage_text

SOURCE = "annotation"
_REF = re.compile(r"#(\d+)")
_PAREN = re.compile(r"\s*\([^)]*\)\s*$")
_SENT = re.compile(r"(?<=[.!?])\s+(?=[\"'“(\[]?[A-Z0-9])")


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


@dataclass
class Annotation:
    labeler: list[dict] = field(default_factory=list)
    filters: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)  # {"stage", "reason"} of dropped records
    notes: Counter = field(default_factory=Counter)


# ------------------------------------------------------------------ chunk labeling

def _keys(text: str) -> set[str]:
    return content_keys(words(text))


def _word_offsets(text: str, ws: list[str]) -> list[int]:
    """Start char of each word (spaCy words are verbatim slices of the text, in order)."""
    out, pos = [], 0
    for w in ws:
        at = text.find(w, pos)
        out.append(at if at >= 0 else pos)
        pos = at + len(w) if at >= 0 else pos
    return out


def _sentence_spans(p: Passage, offset: int) -> list[tuple[int, int]]:
    sents = p.sentences if p.sentences else _SENT.split(p.text)
    spans, pos = [], 0
    for s in sents:
        s = s.strip()
        at = p.text.find(s, pos) if s else -1
        if at < 0:
            spans.append((offset + pos, offset + pos))
            continue
        spans.append((offset + at, offset + at + len(s)))
        pos = at + len(s)
    return spans


class ChunkView:
    """Words of one gold chunk with their title / sentence positions."""

    def __init__(self, p: Passage):
        self.passage = p
        self.text = passage_text(p)
        self.words = words(self.text)
        self.keys = [word_key(normalize_chars(w)) for w in self.words]
        self.content = [is_content(w) for w in self.words]
        offs = _word_offsets(self.text, self.words)
        body = len(p.title) + 2 if p.title else 0
        self.in_title = [o < body - 2 for o in offs]
        self.sentence_of = [-1] * len(self.words)
        spans = _sentence_spans(p, body)
        si = 0
        for i, o in enumerate(offs):  # words and sentences are both in text order
            while si < len(spans) and o >= spans[si][1]:
                si += 1
            if si < len(spans) and spans[si][0] <= o:
                self.sentence_of[i] = si

    def sentences_with(self, keys: set[str], min_share: float = 0.5) -> set[int]:
        """Sentences holding at least ``min_share`` of ``keys``."""
        if not keys:
            return set()
        found: dict[int, set[str]] = {}
        for i, k in enumerate(self.keys):
            if self.sentence_of[i] >= 0 and self.content[i]:
                for want in keys:
                    if key_matches(k, {want}):
                        found.setdefault(self.sentence_of[i], set()).add(want)
        return {s for s, got in found.items() if len(got) >= max(1, min_share * len(keys))}

    def best_sentence(self, keys: set[str], among: set[int] | None = None) -> set[int]:
        """The sentence (of ``among``, if given) with most words matching ``keys``; earliest on ties."""
        if among is not None and not among:
            return set()
        counts = Counter(self.sentence_of[i] for i, k in enumerate(self.keys)
                         if self.sentence_of[i] >= 0 and (among is None or self.sentence_of[i] in among)
                         and self.content[i] and key_matches(k, keys))
        if not counts:
            return {min(among)} if among else set()
        top = max(counts.values())
        return {min(s for s, c in counts.items() if c == top)}

    def label(self, keys: set[str], phrases: list[str], sentences: set[int] | None,
              whole_title: bool = False, anywhere: list[str] = ()) -> list[int]:
        """1 for content words matching ``keys`` and whole occurrences of ``phrases``, inside
        the title or the given sentences (all sentences when None), and for occurrences of the
        ``anywhere`` phrases in the whole chunk."""
        region = [t or sentences is None or s in sentences for t, s in zip(self.in_title, self.sentence_of)]
        labels = [int(r and c and key_matches(k, keys)) for r, c, k in zip(region, self.content, self.keys)]
        if whole_title:  # the title names the entity: keep it whole ("Never Cry Wolf")
            labels = [1 if t and not is_punct(w) else x for t, w, x in zip(self.in_title, self.words, labels)]
        for ph in [*phrases, *anywhere]:
            seq = [word_key(normalize_chars(w)) for w in words(ph)]
            n, free = len(seq), ph in anywhere
            for i in range(len(self.keys) - n + 1 if n else 0):
                if (free or region[i]) and self.keys[i:i + n] == seq:
                    labels[i:i + n] = [1] * n
        return labels


def _has(view: ChunkView, labels: list[int], phrase: str) -> bool:
    """Is at least half of ``phrase``'s content found among the labeled words?"""
    want = _keys(phrase)
    kept = {k for k, l in zip(view.keys, labels) if l}
    return not want or sum(key_matches(k, kept) for k in want) >= len(want) / 2


# ------------------------------------------------------------------ per-dataset steps

def _clean_title(title: str) -> str:
    return _PAREN.sub("", title).strip()


def _musique_steps(q: Question, views: list[ChunkView]) -> list[Step]:
    if not q.decomposition:
        raise AnnotationReject("no_decomposition")
    steps: list[Step] = []
    qk = _keys(q.question)
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
        keys = _keys(text) | {k for k in qk if key_matches(k, _keys(view.passage.title))}
        ans = _keys(sq.answer)
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
        sk, ok = _keys(subj), _keys(obj)
        best, best_score = None, 0.0
        for g, v in enumerate(views):
            tk = _keys(v.passage.title)
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
        sk = _keys(subj)
        deps = [i for i in range(j) if sk and (sk <= _keys(q.evidences[i][2]) or _keys(q.evidences[i][2]) <= sk)]
        if not deps and j > 0 and chained:
            deps = [j - 1]
        if not deps and (q.type or "") == "bridge_comparison" and j >= 2:
            deps = [j - 2]
        view = views[gold_of[j]]
        sup = set((q.supporting_sentences or [[]] * len(views))[gold_of[j]])
        keys = sk | _keys(rel)
        with_obj = view.sentences_with(_keys(obj), 1.0)
        if sup and with_obj and not sup & with_obj:  # a known 2Wiki slip: the object's sentence
            sup |= view.best_sentence(keys, among=with_obj)  # is not listed as supporting
        step = Step(gold_of[j], f"What is the {rel} of {subj}?", obj, deps, keys)
        step.labels = view.label(keys | _keys(obj), [subj, obj], sup or None)
        steps.append(step)
    return steps


def _hotpot_steps(q: Question, views: list[ChunkView]) -> list[Step]:
    qk, ak = _keys(q.question), _keys(q.answer)
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
            entity = {k for k in qk if key_matches(k, _keys(views[g].passage.title))}
            steps.append(Step(g, "", "", [], entity or {k for k in qk if key_matches(k, kept_keys(g, labels))},
                              labels))
        return steps
    titles = [_clean_title(v.passage.title) for v in views[:2]]
    in_q = [len(_keys(t) & qk) / max(1, len(_keys(t))) >= 0.5 for t in titles]
    mentions = [bool(views[g].sentences_with(_keys(titles[1 - g]))) for g in range(2)]  # g names the other
    has_answer = [bool(views[g].sentences_with(ak)) for g in range(2)]
    first = 0
    for rule in (in_q, mentions, [not x for x in has_answer]):  # first rule that tells them apart
        if rule[0] != rule[1]:
            first = 0 if rule[0] else 1
            break
    second = 1 - first
    # the bridge entity: hop 2's title named in hop 1, else hop 1's own title (named in hop 2)
    bridge = titles[second] if mentions[first] else titles[first]
    l1 = label(first, _keys(bridge), [bridge])
    l2 = label(second, set(), [])
    k1 = {k for k in qk if key_matches(k, kept_keys(first, l1))}
    k2 = {k for k in qk if key_matches(k, kept_keys(second, l2))} | (qk - k1)
    steps = [Step(first, "", bridge, [], k1, l1), Step(second, "", q.answer, [0], k2, l2)]
    steps += [Step(g, "", "", [], set(), label(g, set(), [])) for g in range(2, len(views))]
    return steps


_STEPS = {"musique": _musique_steps, "2wikimqa": _2wiki_steps, "hotpotqa": _hotpot_steps}


def _assign_hops(steps: list[Step]) -> None:
    for s in steps:  # dependencies always point backwards, so one pass suffices
        s.hop = 1 + max((steps[d].hop for d in s.deps), default=0)


# ------------------------------------------------------------------ next-hop query labels

_GLUE_PUNCT = {"-", "'", "&", "/"}


def next_query_labels(query: str, kept: list[list[str]], resolved: list[Step], remaining: list[Step],
                      bridges: list[str]) -> tuple[list[str], list[int], list[str]]:
    """Filter input words, their labels, and the bridges missing from the Info words.

    A query word is kept if it matches a remaining step, or matches no answered step and
    is not wedged between two dropped words (a relative clause about the answered part:
    "the country that *produced* Fist Power"). The query's start is not a dropped word: the
    outermost relation leads an English question ("Who was *married* to the creator of ...")
    and belongs to the hop still to come. Its end is: a trailing word closes the innermost,
    answered clause ("... where Signmark was *born*"). The leading question word stays; stop
    words (and hyphens) between two kept words stay. Then each bridge is labeled in the Info words.
    """
    src = filter_input_words(query, kept)
    nq = len(words(query))
    done = set().union(*(s.keys for s in resolved))
    todo = set().union(*(s.keys for s in remaining))
    keys = [word_key(normalize_chars(w)) for w in src]
    content = [i for i in range(nq) if is_content(src[i])]
    status = {i: 2 if key_matches(keys[i], todo) else 0 if key_matches(keys[i], done) else 1 for i in content}
    labels = [0] * len(src)
    for n, i in enumerate(content):
        prev_dropped = n > 0 and status[content[n - 1]] == 0
        next_dropped = n == len(content) - 1 or status[content[n + 1]] == 0
        if status[i] == 2 or (status[i] == 1 and not (prev_dropped and next_dropped)):
            labels[i] = 1
    wh = next((i for i in range(min(nq, 3)) if keys[i] in WH_WORDS), None)
    if wh is not None:  # the question word ("In what city ..."), not relative "where"/"who"
        labels[wh] = 1
    on = [i for i in range(nq) if labels[i]]
    for a, b in zip(on, on[1:]):  # glue
        if all(not is_punct(src[i]) and not is_content(src[i]) or src[i] in _GLUE_PUNCT for i in range(a + 1, b)):
            labels[a + 1:b] = [1] * (b - a - 1)
    info = [i for i in range(nq, len(src)) if not (src[i:i + 2] == INFO or src[i - 1:i + 1] == INFO)]
    in_query = {keys[i] for i in range(nq) if labels[i]}
    missing = []
    for br in bridges:
        want = _keys(br)
        if want and all(key_matches(k, in_query) for k in want):
            continue  # the query already names it
        rep = align([src[i] for i in info], br)
        hits = [info[j] for j, lab in enumerate(rep.labels) if lab]
        if rep.total and rep.fraction < 0.5:  # spelled differently: "Nike" inside "Nike+iPod"
            hits = [i for i in info if is_content(src[i]) and any(key_matches(keys[i], {k}) or
                                                                   key_matches(k, {keys[i]}) for k in want)]
        if not hits:
            missing.append(br)
        for i in hits:
            labels[i] = 1
    return src, labels, missing


# ------------------------------------------------------------------ the question-level entry point

def annotate_question(q: Question) -> Annotation:
    """Labeler and Filter records (docs/design.md formats, ``source="annotation"``) for ``q``."""
    if q.dataset not in _STEPS:
        raise AnnotationReject("unsupported_dataset", q.dataset)
    if not q.gold:
        raise AnnotationReject("no_gold")
    views = [ChunkView(p) for p in q.gold]
    steps = _STEPS[q.dataset](q, views)
    _assign_hops(steps)
    out = Annotation()
    base = {"qid": q.id, "dataset": q.dataset, "source": SOURCE}
    seen: set[tuple[str, str]] = set()

    def add_labeler(hop: int, query: str, s: Step) -> None:
        chunk = views[s.chunk]
        if (query, chunk.passage.id) in seen:
            return
        seen.add((query, chunk.passage.id))
        labels = merged[s.chunk]
        if not any(labels):
            out.rejects.append({"stage": "labeler", "reason": "no_words_labeled"})
            return
        out.labeler.append({**base, "hop": hop, "query": query, "chunk_id": chunk.passage.id,
                            "chunk_words": chunk.words, "labels": labels, "tag": 1})

    merged: dict[int, list[int]] = {}
    for s in steps:
        prev = merged.get(s.chunk, [0] * len(s.labels))
        merged[s.chunk] = [a | b for a, b in zip(prev, s.labels)]
        if s.answer and q.dataset != "hotpotqa" and not _has(views[s.chunk], s.labels, s.answer):
            out.notes["answer_not_in_chunk"] += 1
    kept = {c: [w for w, l in zip(views[c].words, lab) if l] for c, lab in merged.items()}

    query, last = q.question, max(s.hop for s in steps)
    for hop in range(1, last + 1):
        at_hop = [i for i, s in enumerate(steps) if s.hop == hop]
        chunks = list(dict.fromkeys(steps[i].chunk for i in at_hop))
        for i in at_hop:
            add_labeler(hop, query, steps[i])
            if hop > 1:
                add_labeler(hop, q.question, steps[i])
        subsets = ([chunks] if hop < last else []) + ([[c] for c in chunks] if len(chunks) > 1 else [])
        next_query = None
        for info in subsets:
            resolved = [i for i, s in enumerate(steps) if s.hop < hop or (s.hop == hop and s.chunk in info)]
            remaining = [i for i in range(len(steps)) if i not in resolved]
            if not remaining:
                continue
            bridges = [steps[i].answer for i in resolved  # answers found at this hop that others need
                       if steps[i].hop == hop and steps[i].answer and any(i in steps[j].deps for j in remaining)]
            src, labels, missing = next_query_labels(query, [kept[c] for c in info],
                                                     [steps[i] for i in resolved],
                                                     [steps[i] for i in remaining], bridges)
            target = join_words([w for w, l in zip(src, labels) if l])
            reason = ("bridge_not_in_info" if missing else "empty_target" if not any(labels)
                      else "target_not_aligned" if align(src, target).fraction < 1.0 else None)
            if reason:
                out.rejects.append({"stage": "filter", "reason": reason})
                continue
            out.filters.append({**base, "hop": hop, "words": src, "labels": labels, "target": target})
            for j in remaining:
                if set(steps[j].deps) <= set(resolved):
                    add_labeler(hop + 1, target, steps[j])
            if info is chunks:
                next_query = target
        if hop < last:
            if next_query is None:  # no usable next-hop query: later hops get the question only
                for i, s in enumerate(steps):
                    if s.hop > hop:
                        add_labeler(s.hop, q.question, s)
                break
            query = next_query
    return out
