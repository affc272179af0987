"""Tune the extractive reader's span decoding on the dev files' oracle reading, and optionally store it.

    python scripts/tune_reader.py --reader checkpoints/reader-all --output reports/reader/decoding [--write]

The encoder runs once per dev question (its gold passages read together, as ``scripts/eval_reader.py``
does); every grid point then only re-decodes the cached logits (:func:`effrag.models.reader.decode_span`),
so the grid costs seconds. The settings (:data:`effrag.models.reader.DECODING_DEFAULTS`):

* ``question_echo_penalty``: subtracted from a span that repeats the question's own words, unless the
  question offers alternatives (``echoes_question``): the reader otherwise answers a bridge question
  with its bridge entity;
* ``length_penalty``: per token after the first (the reader's spans run longer than the gold answers);
* ``yes_bias``: added to the type head's "yes" logit (the train files hold 54 yes against 141 no
  answers, and the head says "no" to nearly every yes/no question);
* ``max_answer_tokens``.

The objective is F1 over all the dev questions pooled (each question counts once). A mean of the
datasets' F1 would let 2Wiki's 10 yes/no questions pick ``yes_bias``: raising "yes" wins 2Wiki
(7 of its 10 are yes) and loses HotpotQA (13 of 34), i.e. the type head has no yes-versus-no signal
to unlock, only a prior to guess. Only dev questions are used; the report holds every grid point. ``--write`` stores the
best settings in the checkpoint's ``effrag_config.json`` options, with this run's provenance, so
``effrag eval --reader DIR`` and every other user of the reader decode with them.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATASETS = ["hotpotqa", "2wikimqa", "musique"]


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def ints(text: str) -> list[int]:
    return [int(x) for x in floats(text)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reader", required=True, metavar="DIR", help="reader checkpoint (checkpoints/reader-all)")
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"),
                    help="folder with <dataset>/dev.jsonl (env DATA)")
    ap.add_argument("--datasets", nargs="+", default=DATASETS)
    ap.add_argument("--limit", type=int, default=None, help="first N dev questions per dataset")
    ap.add_argument("--echo-penalties", type=floats, default=floats("0,1,2,4,8,10000"))
    ap.add_argument("--length-penalties", type=floats, default=floats("0,0.1,0.2,0.4,0.6,0.8"))
    ap.add_argument("--max-answer-tokens", type=ints, default=ints("15,30"))
    ap.add_argument("--yes-biases", type=floats, default=floats("0,1,2,3"))
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all usable cores)")
    ap.add_argument("--write", action="store_true", help="store the best settings in the checkpoint")
    ap.add_argument("--output", required=True, type=Path)
    return ap.parse_args(argv)


def dev_logits(reader, data: Path, datasets: list[str], limit: int | None) -> dict[str, list[tuple]]:
    """Per dataset: (question, gold answers, windows, window logits) of every dev question with gold passages."""
    from effrag.data import load_questions
    from effrag.text import reader_passage

    cache: dict[str, list[tuple]] = {}
    for ds in datasets:
        path = data / ds / "dev.jsonl"
        questions = [q for q in load_questions(path, limit=limit) if q.gold]
        if not questions:
            raise SystemExit(f"{path}: no question with gold passages to tune on")
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


def store_decoding(reader_dir: Path, settings: dict, provenance: dict) -> None:
    """Write ``settings`` into the checkpoint's ``effrag_config.json`` options (weights untouched)."""
    from effrag.models.heads import CONFIG_NAME, read_effrag_config

    meta = read_effrag_config(reader_dir)
    meta["options"] = {**meta.get("options", {}), **settings}
    meta["decoding_tuned"] = provenance
    tmp = reader_dir / (CONFIG_NAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    os.replace(tmp, reader_dir / CONFIG_NAME)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from effrag.evaluation.report import md_table
    from effrag.hardware import usable_cores
    from effrag.models.reader import DECODING_DEFAULTS, load_reader_checkpoint
    from effrag.provenance import write_report

    torch.set_num_threads(args.threads or usable_cores())
    reader = load_reader_checkpoint(args.reader).eval()
    cache = dev_logits(reader, Path(args.data), args.datasets, args.limit)
    grid = [{"max_answer_tokens": m, "question_echo_penalty": e, "length_penalty": lp, "yes_bias": y}
            for m, e, lp, y in itertools.product(args.max_answer_tokens, args.echo_penalties, args.length_penalties,
                                                 args.yes_biases)]
    checkpoint = reader.decoding()
    if checkpoint not in grid:
        grid.insert(0, checkpoint)
    rows = []
    for i, settings in enumerate(grid, 1):
        per = score(reader, cache, settings)
        rows.append({"settings": settings, "datasets": per,
                     "f1": sum(d["f1"] * d["n"] for d in per.values()) / sum(d["n"] for d in per.values())})
        print(f"{i}/{len(grid)} {settings}: F1 {rows[-1]['f1']:.2f}", file=sys.stderr, flush=True)
    best = max(rows, key=lambda r: r["f1"])
    plain = next((r for r in rows if r["settings"] == DECODING_DEFAULTS), None)
    start = next(r for r in rows if r["settings"] == checkpoint)

    def line(label: str, r: dict) -> list[str]:
        s = r["settings"]
        return ([label, str(s["max_answer_tokens"]), f"{s['question_echo_penalty']:g}", f"{s['length_penalty']:g}",
                 f"{s['yes_bias']:g}"]
                + [f"{r['datasets'][ds]['em']:.1f} / {r['datasets'][ds]['f1']:.1f}" for ds in args.datasets]
                + [f"{r['f1']:.2f}"])

    cols = ["decoding", "max tokens", "echo penalty", "length penalty", "yes bias"] + [f"{ds} EM / F1" for ds in args.datasets] \
        + ["F1, all questions"]
    table = [line("best (chosen)", best), line("checkpoint's before", start)]
    if plain is not None and plain is not start:
        table.append(line("plain argmax", plain))
    ranked = sorted(rows, key=lambda r: -r["f1"])
    table += [line(f"#{i}", r) for i, r in enumerate(ranked[:10], 1)]
    command = "python scripts/tune_reader.py " + " ".join(argv if argv is not None else sys.argv[1:])
    sizes = ", ".join(f"{ds} {len(rows_)}" for ds, rows_ in cache.items())
    md = (f"# Reader span decoding tuned on dev oracle reading\n\nReader `{args.reader}`; gold passages read "
          f"together; dev questions: {sizes}. Objective: F1 over all of them pooled. {len(grid)} settings; "
          "the ten best are listed.\n\n" + md_table(cols, table)
          + ("\n\nStored in the checkpoint's options (`--write`)." if args.write else "")
          + f"\n\nCommand: `{command}`\n")
    files = [Path(args.data) / ds / "dev.jsonl" for ds in args.datasets]
    write_report(args.output, md, {"best": best, "checkpoint_before": start, "grid": rows}, args=args, argv=argv,
                 prog="python scripts/tune_reader.py", files=files)
    if args.write:
        store_decoding(Path(args.reader), best["settings"],
                       {"command": command, "objective": "dev oracle F1, all questions pooled", "f1": round(best["f1"], 2),
                        "before": checkpoint, "report": str(args.output)})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
