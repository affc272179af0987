"""Annotation-derived training data (no LLM): EfficientRAG records from the datasets' own labels.

Each question becomes a list of :class:`Step` (one sub-question per gold chunk, with
its answer and dependencies); the generic part then emits records exactly as the
LLM path does (``data_synthesis.llm_steps``: hops 1-based, chunk words of
``"<title>: <text>"``, Filter input ``"<query> Info: <kept> Info: <kept>..."``).
How each dataset's annotation becomes steps (and kept words) is :mod:`.dataset_steps`; a gold chunk's words,
sentences and labeling are :mod:`.chunk_labels`.

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

from collections import Counter
from dataclasses import dataclass, field

from effrag.data.records import Question
from effrag.text import INFO, filter_input_words, join_words, words

from .align import WH_WORDS, align, is_content, is_punct, key_matches, normalize_chars, word_key
from .chunk_labels import ChunkView, has_phrase, text_keys
from .dataset_steps import STEPS, AnnotationReject, Step, assign_hops

SOURCE = "annotation"

# what other modules and the tests import from here
__all__ = ["SOURCE", "Annotation", "AnnotationReject", "Step", "annotate_question", "next_query_labels",
           "filter_input_words"]


@dataclass
class Annotation:
    labeler: list[dict] = field(default_factory=list)
    filters: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)  # {"stage", "reason"} of dropped records
    notes: Counter = field(default_factory=Counter)


# ------------------------------------------------------------------ next-hop query labels

_GLUE_PUNCT = {"-", "'", "&", "/"}


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
        want = text_keys(br)
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
    if q.dataset not in STEPS:
        raise AnnotationReject("unsupported_dataset", q.dataset)
    if not q.gold:
        raise AnnotationReject("no_gold")
    views = [ChunkView(p) for p in q.gold]
    steps = STEPS[q.dataset](q, views)
    assign_hops(steps)
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
        if s.answer and q.dataset != "hotpotqa" and not has_phrase(views[s.chunk], s.labels, s.answer):
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
