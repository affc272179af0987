"""Ranker groups from the loop's own searches (``effrag ranker-data --from-loop SYSTEM``): what a distilled pool
ranker reads at inference.

The synthesised groups (:mod:`.ranker_groups`) pair each oracle query with its gold and 7 negatives. The loop's later
queries are not oracle queries: they are the Filter's kept words, and its ranker reads every chunk they retrieve (the
new ones, and with ``rescore_top`` the seen ones again). Here a trained system's loop (its Labeler and Filter, with a
loop config of the system) runs over the train questions, and every search it makes becomes one group: its top
``depth`` hits under the text the loop's ranker reads them with (the query, or with ``rank_query: info`` a later
query's Filter input), each flagged gold by the question's annotation. A hit that copies a gold article under
another id (the same title) is left out, as :mod:`.ranker_groups` leaves it out of the negatives: never taught as
irrelevant. A group needs a gold and a negative (the ranker task's contract); ``counts`` says how many searches had
none. ``effrag ranker-teacher`` then scores the groups: soft targets for the student on the loop's own pairs.

The pool ranker only reorders the pool, so it runs only where the config lets it choose what the Labeler reads
(``labeler_top``): otherwise the queries, and so the groups, are the same with or without it.

Questions run in batches; each finished batch's groups are appended to ``ranker.jsonl.partial``, fsynced, and its end
offset recorded in ``loop_groups.progress.json`` (with the offsets of the batches before it), so a killed run resumes
after the last whole batch (bytes past that offset, a torn write, are cut off). A partial file shorter than its
recorded offset (its tail lost to an unclean shutdown, or cut by hand) is never padded: the run resumes after the
last recorded batch the file still holds whole, or, when it holds none, starts that output again; a one-line warning
says which.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from effrag.data.records import normalize_space
from effrag.state_files import commit, read_json, write_json_atomic, write_text_atomic

PROGRESS_NAME = "loop_groups.progress.json"
EARLIER_BATCHES = 16  # how many earlier batch ends the progress keeps: where a partial cut short can resume
_log = logging.getLogger(__name__)


def _title_key(title: str) -> str:
    return normalize_space(title).casefold()


class RecordingRetriever:
    """A retriever that remembers each query's longest hit list of the current batch (the loop refills past seen
    chunks with a larger ``k``; a deterministic retriever's shorter lists are its prefixes)."""

    def __init__(self, retriever):
        self.retriever = retriever
        self.hits: dict[str, list[Any]] = {}

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        out = self.retriever.search(queries, k)
        for q, hs in zip(queries, out):
            if len(hs) > len(self.hits.get(q, ())):
                self.hits[q] = list(hs)
        return out


def search_groups(question, state, hits: dict[str, list[Any]], depth: int, counts: dict[str, int],
                  info: bool = False) -> list[dict]:
    """One group per search of one question's loop (its :class:`~effrag.pipelines.efficientrag.LoopState`): its
    top ``depth`` hits under ``query``, the text the loop's ranker reads them with: with ``info``
    (``rank_query: info``) a later query's Filter input, "<query> Info: <kept words>" (``search_query`` is what
    was searched)."""
    gold_ids = set(question.gold_ids)
    gold_titles = {_title_key(p.title) for p in question.gold}
    groups = []
    for entry in state.trace:
        for query in entry["queries"]:
            counts["searches"] += 1
            cands = []
            for h in hits.get(query, [])[:depth]:
                gold = h.id in gold_ids
                if not gold and _title_key(h.title) in gold_titles:
                    counts["gold_copies_left_out"] += 1
                    continue
                cands.append({"chunk_id": h.id, "title": h.title, "text": h.text, "gold": int(gold)})
            if not any(c["gold"] for c in cands):
                counts["no_gold"] += 1
                continue
            if len(cands) < 2:
                counts["no_negative"] += 1
                continue
            read = state.infos.get(query, query) if info else query
            groups.append({"qid": question.id, "dataset": question.dataset, "hop": entry["hop"], "query": read,
                           "search_query": query, "candidates": cands})
            counts["groups"] += 1
            counts["pairs"] += len(cands)
    return groups


def loop_group_settings(system: str | Path, inputs: Sequence[str | Path], *, loop_config: str | Path | None = None,
                        retriever: str = "hybrid", depth: int = 15, limit: int | None = None) -> dict[str, Any]:
    """What makes an output: the system's Labeler and Filter (by their weights), its loop config, the inputs and
    options. A partial output resumes, and a finished one is reused, only under the same settings."""
    from effrag.models.model_files import fingerprint
    from effrag.pipelines.efficientrag.system import open_system

    files = open_system(system, loop_config)
    return {"from_loop": str(system), "loop_config": str(files.config) if files.config else None,
            "labeler_fingerprint": fingerprint(files.labeler), "filter_fingerprint": fingerprint(files.filter),
            "inputs": [str(f) for f in inputs], "retriever": retriever, "depth": depth, "limit": limit,
            **({"encoder": files.encoder} if files.encoder else {})}


def _resume(out: Path, settings: dict) -> tuple[int, dict[str, int], list[dict]]:
    """How many questions a partial output already holds, their counts, and the recorded batch ends up to that one
    (the next progress record's ``earlier``). A partial begun with other settings is removed, bytes past the last
    recorded batch (a torn write) are cut off. A partial shorter than its recorded offset resumes after the latest
    recorded batch end it still holds whole (the progress keeps :data:`EARLIER_BATCHES`), else starts again, with a
    one-line warning: never padded (``truncate`` to a larger size fills the gap with NUL bytes)."""
    partial, progress = out / "ranker.jsonl.partial", out / PROGRESS_NAME
    fix = f"remove it and {partial.name} to start this output again"
    state = read_json(progress, fix) if progress.is_file() else None
    if not partial.is_file() or not isinstance(state, dict) or state.get("settings") != settings:
        partial.unlink(missing_ok=True)
        return 0, {}, []
    try:
        ends = [{"questions": int(e["questions"]), "bytes": int(e["bytes"]), "counts": dict(e["counts"])}
                for e in [*state.get("earlier", []), state]]  # oldest first
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{progress}: not a loop-groups progress record ({e!r} missing or wrong); {fix}") from None
    size, last = partial.stat().st_size, ends[-1]
    with partial.open("r+b") as f:
        for n in range(len(ends) - 1, -1, -1):
            end = ends[n]
            if end["bytes"] <= size and _line_end(f, end["bytes"]):
                f.truncate(end["bytes"])  # a torn write after that batch; never past the file's end
                break
        else:
            n = None
    if n is None:
        _log.warning("%s is %d bytes, shorter than the %d its progress recorded, and holds none of the recorded "
                     "batches whole: starting this output again", partial, size, last["bytes"])
        partial.unlink()
        progress.unlink()
        return 0, {}, []
    if end is not last:  # the progress is made to say so before anything is appended again
        _log.warning("%s is %d bytes, shorter than the %d its progress recorded (its tail was lost, e.g. to an "
                     "unclean shutdown): resuming after question %d instead of %d", partial, size, last["bytes"],
                     end["questions"], last["questions"])
        write_json_atomic(progress, {"settings": settings, **end, "earlier": ends[:n]})
    return end["questions"], end["counts"], ends[:n + 1][-EARLIER_BATCHES:]


def _line_end(f, offset: int) -> bool:
    """Whether ``offset`` of file ``f`` ends a line (or is the file's start): where a recorded batch ended."""
    if offset == 0:
        return True
    f.seek(offset - 1)
    return f.read(1) == b"\n"


def write_loop_groups(system: str | Path, inputs: Sequence[str | Path], output: str | Path, *,
                      loop_config: str | Path | None = None, retriever: str = "hybrid", depth: int = 15,
                      batch_size: int = 32, limit: int | None = None, cache_dir: str | Path | None = None,
                      bf16: bool = True, show_progress: bool = True) -> dict[str, Any]:
    """``effrag ranker-data --from-loop``: ``<output>/ranker.jsonl`` and ``<output>/ranker_data.json``.

    The questions and the corpus come from ``inputs`` (their contexts pooled, searched by a ``retriever`` of that
    kind, cached as every run's index is, its dense leg the encoder the loop config names); the loop is ``system``'s
    with ``loop_config`` (default its ``loop.json``).
    """
    from effrag.pipelines.efficientrag import EfficientRAGLoop, build_config, load_models
    from effrag.pipelines.efficientrag.system import open_system
    from effrag.setup import RunSetup

    from .ranker_groups import list_questions

    files = open_system(system, loop_config)
    config = build_config(str(files.config) if files.config else None)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    settings = loop_group_settings(system, inputs, loop_config=loop_config, retriever=retriever, depth=depth,
                                   limit=limit)
    questions = list_questions(inputs)[:limit] if limit else list_questions(inputs)
    setup = RunSetup.build(questions, corpus_from=list(inputs), retriever=retriever, bf16=bf16, cache_dir=cache_dir,
                           encoder=files.encoder)
    ranker = files.ranker if config.labeler_top is not None else None
    labeler, filter_model, *rest = load_models(files.labeler, files.filter, ranker=ranker)
    recorder = RecordingRetriever(setup.retriever)
    loop = EfficientRAGLoop(labeler, filter_model, recorder, config, ranker=rest[0] if rest else None)
    done, counts, earlier = _resume(out, settings)  # earlier: the recorded batch ends so far, newest last
    counts = {"searches": 0, "groups": 0, "pairs": 0, "no_gold": 0, "no_negative": 0, "gold_copies_left_out": 0,
              **counts}
    partial, progress = out / "ranker.jsonl.partial", out / PROGRESS_NAME
    from tqdm import tqdm

    bar = tqdm(total=len(setup.questions), initial=done, unit="question", desc="loop groups",
               disable=not show_progress)
    with partial.open("ab") as f:
        for i in range(done, len(setup.questions), batch_size):
            batch = setup.questions[i:i + batch_size]
            recorder.hits = {}
            states = loop.run_states([q.question for q in batch])
            lines = [json.dumps(g, ensure_ascii=False) + "\n" for q, s in zip(batch, states)
                     for g in search_groups(q, s, recorder.hits, depth, counts, config.rank_query == "info")]
            f.write("".join(lines).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())  # on disk before the progress says so: an unclean shutdown cannot cut it shorter
            end = {"questions": i + len(batch), "bytes": f.tell(), "counts": dict(counts)}
            write_json_atomic(progress, {"settings": settings, **end, "earlier": earlier})
            earlier = [*earlier, end][-EARLIER_BATCHES:]  # where a partial cut short can still resume
            bar.update(len(batch))
    bar.close()
    commit(partial, out / "ranker.jsonl")
    progress.unlink()
    info = {**settings, "questions": len(setup.questions), **counts}
    write_text_atomic(out / "ranker_data.json", json.dumps(info, indent=2) + "\n")
    return info
