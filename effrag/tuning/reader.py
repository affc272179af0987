"""The extractive reader's span decoding, tuned on the dev files' oracle reading, and stored in its checkpoint.

The encoder runs once per dev question (its gold passages read together, as ``scripts/eval_reader.py`` does,
:func:`dev_logits`); every grid point then only re-decodes the cached logits (:func:`score`), so the grid costs
seconds. The settings (:data:`effrag.models.reader.DECODING_DEFAULTS`): ``question_echo_penalty`` (subtracted
from a span that repeats the question's own words, unless the question offers alternatives: the reader otherwise
answers a bridge question with its bridge entity), ``length_penalty`` (per token after the first), ``yes_bias``
(added to the type head's "yes" logit) and ``max_answer_tokens``.

The objective is F1 over all the dev questions pooled (each question counts once): a mean of the datasets' F1
would let 2Wiki's 10 yes/no questions pick ``yes_bias``. :func:`store_decoding` writes the best settings into
the checkpoint's options with the run's provenance, so ``effrag eval --reader DIR`` and every other user of the
reader decode with them. ``scripts/tune_reader.py`` is the command line.
"""
from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def dev_logits(reader, data: str | Path, datasets: Sequence[str], limit: int | None) -> dict[str, list[tuple]]:
    """Per dataset: (question, gold answers, windows, window logits) of every dev question with gold passages."""
    from effrag.data import load_questions
    from effrag.setup import dataset_file
    from effrag.text import reader_passage

    cache: dict[str, list[tuple]] = {}
    for ds in datasets:
        path = dataset_file(data, ds, "dev")
        questions = [q for q in load_questions(path, limit=limit) if q.gold]
        if not questions:
            raise ValueError(f"{path}: no question with gold passages to tune on")
        t0 = time.perf_counter()
        rows = []
        for i, q in enumerate(questions, 1):
            windows, logits = reader.window_logits(q.question, [reader_passage(p.title, p.text) for p in q.gold])
            rows.append((q.question, q.answers, windows, logits))
            if i % 100 == 0 or i == len(questions):
                print(f"{ds}: {i}/{len(questions)} questions read ({time.perf_counter() - t0:.0f}s)",
                      file=sys.stderr, flush=True)
        cache[ds] = rows
    return cache


def score(reader, cache: dict[str, list[tuple]], settings: dict) -> dict[str, dict]:
    """EM and F1 (%, the dataset's official rule) of the cached windows decoded with ``settings``."""
    from effrag.evaluation.metrics import answer_rule, exact_match, f1

    out = {}
    for ds, rows in cache.items():
        rule = answer_rule(ds)
        em = f = 0.0
        for question, answers, windows, logits in rows:
            ans, _ = reader.answer_windows(question, windows, logits, **settings)
            em += exact_match(ans.answer, answers)
            f += f1(ans.answer, answers, rule)
        out[ds] = {"n": len(rows), "em": 100 * em / len(rows), "f1": 100 * f / len(rows)}
    return out


def tune_decoding(reader, cache: dict[str, list[tuple]], *, max_answer_tokens: Sequence[int],
                  echo_penalties: Sequence[float], length_penalties: Sequence[float],
                  yes_biases: Sequence[float]) -> dict[str, Any]:
    """Every grid point (and the checkpoint's own decoding) scored: ``{"rows", "best", "start", "plain"}``, each
    row ``{"settings", "datasets", "f1"}`` (F1 over all questions pooled)."""
    from effrag.models.reader import DECODING_DEFAULTS

    grid = [{"max_answer_tokens": m, "question_echo_penalty": e, "length_penalty": lp, "yes_bias": y}
            for m, e, lp, y in itertools.product(max_answer_tokens, echo_penalties, length_penalties, yes_biases)]
    checkpoint = reader.decoding()
    if checkpoint not in grid:
        grid.insert(0, checkpoint)
    rows = []
    for i, settings in enumerate(grid, 1):
        per = score(reader, cache, settings)
        rows.append({"settings": settings, "datasets": per,
                     "f1": sum(d["f1"] * d["n"] for d in per.values()) / sum(d["n"] for d in per.values())})
        print(f"{i}/{len(grid)} {settings}: F1 {rows[-1]['f1']:.2f}", file=sys.stderr, flush=True)
    return {"rows": rows, "best": max(rows, key=lambda r: r["f1"]),
            "start": next(r for r in rows if r["settings"] == checkpoint),
            "plain": next((r for r in rows if r["settings"] == DECODING_DEFAULTS), None)}


def tuning_report(reader_name: str, tuned: dict[str, Any], datasets: Sequence[str], sizes: dict[str, int],
                  command: str, written: bool) -> str:
    """The markdown report: the chosen settings, the checkpoint's before, plain argmax and the ten best."""
    from effrag.evaluation.report import md_table

    def line(label: str, r: dict) -> list[str]:
        s = r["settings"]
        return ([label, str(s["max_answer_tokens"]), f"{s['question_echo_penalty']:g}", f"{s['length_penalty']:g}",
                 f"{s['yes_bias']:g}"]
                + [f"{r['datasets'][ds]['em']:.1f} / {r['datasets'][ds]['f1']:.1f}" for ds in datasets]
                + [f"{r['f1']:.2f}"])

    cols = ["decoding", "max tokens", "echo penalty", "length penalty", "yes bias"] \
        + [f"{ds} EM / F1" for ds in datasets] + ["F1, all questions"]
    best, start, plain = tuned["best"], tuned["start"], tuned["plain"]
    table = [line("best (chosen)", best), line("checkpoint's before", start)]
    if plain is not None and plain is not start:
        table.append(line("plain argmax", plain))
    ranked = sorted(tuned["rows"], key=lambda r: -r["f1"])
    table += [line(f"#{i}", r) for i, r in enumerate(ranked[:10], 1)]
    counts = ", ".join(f"{ds} {n}" for ds, n in sizes.items())
    return (f"# Reader span decoding tuned on dev oracle reading\n\nReader `{reader_name}`; gold passages read "
            f"together; dev questions: {counts}. Objective: F1 over all of them pooled. {len(tuned['rows'])} "
            "settings; the ten best are listed.\n\n" + md_table(cols, table)
            + ("\n\nStored in the checkpoint's options (`--write`)." if written else "")
            + f"\n\nCommand: `{command}`\n")


def store_decoding(reader_dir: str | Path, settings: dict, provenance: dict) -> None:
    """Write ``settings`` into the checkpoint's options, with how they were tuned (weights untouched)."""
    from effrag.models.model_files import update_effrag_config

    update_effrag_config(reader_dir, options=settings, decoding_tuned=provenance)
