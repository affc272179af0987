"""Filter records built on the Labeler's own kept words (``effrag filter-data``): exposure augmentation.

The synthesised Filter records (:func:`.annotation.next_query_labels`) put the *oracle* kept words of the
hop's gold chunks after ``Info:``: short and clean. At inference the Filter reads what the trained Labeler
kept instead: longer, noisier, and full of repeats of the question's own entity ("Mach number The Mach number
named after Austrian physicist philosopher Ernst Mach ... Mach Mach2 Machs"). On MuSiQue dev the bridge
answer was among the kept words of its chunk in 69 of 100 cases, but in the next query in only 33: the
Filter dropped it. This is exposure bias, and the remedy is to train on the inputs the model will see.

For each Filter record, every ``Info`` block is matched to the Labeler record it came from (same question,
hop and query, the block equal to that record's oracle kept words); the trained Labeler reads that
(query, chunk) pair, and the block is replaced by the words it keeps (``keep prob >= token_threshold``, as
the loop does). Labels: the query words keep theirs; an Info word is kept when it is a content word whose
key matches a kept oracle Info word (every occurrence, so that repeats do not teach the Filter to drop the
bridge), and a non-content word between two kept words stays as glue. A record whose blocks cannot all be
matched is left out (counted). The output holds the original records and the new ones.

Measured, and not in the recipe (reports/archive/efficientrag/next-query): a Filter trained on the original plus the
exposed records (all 1,742 matched, Labeler at token threshold 0.2) lowered MuSiQue dev recall at 10 chunks
from 71.90 to 69.07 over the same loop grid. It learned to keep fewer Info words (most of the Labeler's words
are labeled 0), and dense retrieval does better with a richer query: a *lower* ``filter_threshold`` helped
the original Filter. The tool stays for Labelers whose kept words are cleaner (a larger backbone) and for
LLM-synthesised records, where the gap between oracle and predicted Info may differ.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from effrag.text import INFO, filter_input_words, join_words, words

from .align import is_content, key_matches, normalize_chars, word_key

Predict = Callable[[list[str], list[list[str]]], list[tuple[float, list[float]]]]


def split_filter_words(ws: Sequence[str], values: Sequence | None = None) -> tuple[list, list[list]]:
    """``"<query> Info: <block> Info: <block>"`` words -> (query words, blocks); with ``values`` (one per word,
    e.g. the labels), those values split at the same places."""
    vals = ws if values is None else values
    marks = [i for i in range(len(ws) - 1) if list(ws[i:i + 2]) == INFO]
    bounds = marks + [len(ws)]
    return list(vals[:bounds[0]]), [list(vals[a + 2:b]) for a, b in zip(bounds, bounds[1:])]


def _key(w: str) -> str:
    return word_key(normalize_chars(w))


def relabel_info(query_labels: list[int], oracle_blocks: list[list[str]], oracle_labels: list[list[int]],
                 query: list[str], new_blocks: list[list[str]]) -> tuple[list[str], list[int]]:
    """The Filter input over ``new_blocks`` and its labels (see the module docstring)."""
    keep = {_key(w) for block, labs in zip(oracle_blocks, oracle_labels) for w, lab in zip(block, labs)
            if lab and is_content(w)}
    src = filter_input_words(join_words(query), new_blocks)
    if src[:len(query)] != query:  # the query must re-tokenise to itself, or its labels would shift
        raise ValueError(f"query words do not round-trip: {join_words(query)!r}")
    labels = list(query_labels) + [0] * (len(src) - len(query))
    info = [i for i in range(len(query), len(src)) if not (src[i:i + 2] == INFO or src[i - 1:i + 1] == INFO)]
    for i in info:
        if is_content(src[i]) and key_matches(_key(src[i]), keep):
            labels[i] = 1
    on = [i for i in info if labels[i]]
    for a, b in zip(on, on[1:]):  # glue: "University *of* Prague"
        if b - a == 2 and not is_content(src[a + 1]) and src[a + 1:a + 2] != INFO[:1]:
            labels[a + 1] = 1
    return src, labels


def exposed_filter_records(labeler_records: Iterable[dict], filter_records: Iterable[dict], predict: Predict,
                           token_threshold: float, batch_size: int = 64,
                           progress: Callable[[Iterable], Iterable] = lambda x: x) -> tuple[list[dict], Counter]:
    """New Filter records whose Info blocks are the Labeler's predicted kept words; ``predict`` is a Labeler's
    ``predict(queries, chunk_words)``. Returns (records, counts)."""
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for r in labeler_records:
        if r.get("tag") == 1:
            by_key[(r["qid"], r["hop"], tuple(words(r["query"])))].append(r)
    counts: Counter = Counter()
    jobs: list[tuple[dict, list[str], list[list[str]], list[list[int]], list[dict]]] = []
    for rec in filter_records:
        counts["filter_records"] += 1
        query, blocks = split_filter_words(rec["words"])
        if not blocks:
            counts["no_info"] += 1
            continue
        _, lab_blocks = split_filter_words(rec["words"], rec["labels"])
        cands = by_key.get((rec["qid"], rec["hop"], tuple(query)), [])
        sources = []
        for block in blocks:
            src = next((c for c in cands if [w for w, lab in zip(c["chunk_words"], c["labels"]) if lab] == block
                        and c not in sources), None)
            if src is None:
                break
            sources.append(src)
        if len(sources) != len(blocks):
            counts["unmatched"] += 1
            continue
        jobs.append((rec, query, blocks, lab_blocks, sources))
    pairs = [(s["query"], s["chunk_words"]) for *_, sources in jobs for s in sources]
    preds: list[tuple[float, list[float]]] = []
    for i in progress(range(0, len(pairs), batch_size)):
        chunk = pairs[i:i + batch_size]
        preds += predict([q for q, _ in chunk], [list(ws) for _, ws in chunk])
    out, at = [], 0
    for rec, query, blocks, lab_blocks, sources in jobs:
        new_blocks = []
        for s in sources:
            _, probs = preds[at]
            at += 1
            new_blocks.append([w for w, pr in zip(s["chunk_words"], probs) if pr >= token_threshold])
        src, labels = relabel_info(rec["labels"][:len(query)], blocks, lab_blocks, query, new_blocks)
        counts["records"] += 1
        counts["oracle_info_words"] += sum(map(len, blocks))
        counts["predicted_info_words"] += sum(map(len, new_blocks))
        out.append({**{k: v for k, v in rec.items() if k not in ("words", "labels", "target")},
                    "source": f"{rec.get('source', 'annotation')}+labeler", "words": src, "labels": labels,
                    "target": join_words([w for w, lab in zip(src, labels) if lab])})
    return out, counts


FILTER_KEYS = ("qid", "hop", "words", "labels")
LABELER_KEYS = ("qid", "hop", "query", "chunk_words", "labels", "tag")


def _checked(path: Path, keys: Sequence[str]) -> list[dict]:
    """The records of a synthesised JSONL file; one without a needed field, or whose words and labels differ
    in length, is an error naming the file and line."""
    from effrag.jsonl import numbered_jsonl

    rows = []
    for n, rec in numbered_jsonl(path):
        missing = [k for k in keys if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise ValueError(f"{path}:{n}: record has no {', '.join(missing)} (an `effrag synthesize` record is needed)")
        ws = rec["words"] if "words" in rec else rec["chunk_words"]
        if len(ws) != len(rec["labels"]):
            raise ValueError(f"{path}:{n}: {len(ws)} words but {len(rec['labels'])} labels")
        rows.append(rec)
    return rows


def write_exposed_filter_data(synth: str | Path, labeler, output: str | Path, token_threshold: float,
                              batch_size: int = 64, show_progress: bool = True,
                              provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """``synth``/{labeler,filter}.jsonl + a trained Labeler -> ``output``/filter.jsonl (the original records,
    then the exposed ones) and ``output``/filter_data.json (counts and provenance)."""
    from tqdm.auto import tqdm

    synth, out = Path(synth), Path(output)
    for name in ("labeler.jsonl", "filter.jsonl"):
        if not (synth / name).is_file():
            raise FileNotFoundError(f"{synth / name} not found (an `effrag synthesize` output folder is needed)")
    original = _checked(synth / "filter.jsonl", FILTER_KEYS)
    if not original:
        raise ValueError(f"{synth / 'filter.jsonl'} has no records")
    labeler_records = _checked(synth / "labeler.jsonl", LABELER_KEYS)

    def predict(queries, chunk_words):
        return labeler.predict(queries, chunk_words, batch_size=batch_size)

    bar = (lambda it: tqdm(list(it), desc="labeler", unit="batch")) if show_progress else (lambda it: it)
    new, counts = exposed_filter_records(labeler_records, original, predict, token_threshold, batch_size, bar)
    if not new:
        raise ValueError(f"no Filter record of {synth} could be matched to its Labeler records")
    out.mkdir(parents=True, exist_ok=True)
    from effrag.state_files import atomic_open, write_text_atomic

    with atomic_open(out / "filter.jsonl") as f:
        for r in [*original, *new]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    info = {"synth": str(synth), **(provenance or {}), "token_threshold": token_threshold, "counts": dict(counts),
            "original_records": len(original), "exposed_records": len(new)}
    write_text_atomic(out / "filter_data.json", json.dumps(info, indent=2))
    return info
