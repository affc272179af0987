"""Oracle reading: the extractive reader's EM/F1 when it is given each dev question's gold passages.

    python scripts/eval_reader.py --reader checkpoints/reader-all --data ../shared/data --output reports/reader

For every dev question of each dataset, the reader reads the gold passages (``"title: text"``, in the
dataset's order) packed together (``together``: windows of the reader's length, the most confident
window answers) and, for comparison, each passage alone (``each``). EM/F1 follow each dataset's
official rule (:func:`effrag.evaluation.metrics.answer_rule`). Rows: every question, by gold answer
kind (yes/no vs a span) and by the dataset's question type (HotpotQA bridge/comparison, 2Wiki's four
types). Writes ``report.md``, ``results.json`` (with provenance) and ``predictions-<dataset>.jsonl``.
This bounds what any retrieval method can reach with this reader: retrieval can only remove evidence.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = ("together", "each")


def parse_args(argv=None):
    from effrag.cli_args import add_data_args, add_output_arg, add_reader_arg, add_source_args, add_threads_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reader_arg(ap, required=True)
    add_data_args(ap)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    add_threads_arg(ap)
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


def answer_kind(answer: str) -> str:
    from effrag.models.reader import YES_NO

    return "yes/no" if answer.strip().lower() in YES_NO else "span"


def describe_decoding(decoding: dict) -> str:
    """``max_answer_tokens 15, ...``; a reader vote's members as ``name (…); name (…)``."""
    if all(isinstance(v, dict) for v in decoding.values()):
        return "; ".join(f"{name} ({describe_decoding(d)})" for name, d in decoding.items())
    return ", ".join(f"{k} {v:g}" for k, v in decoding.items())


def score_rows(rows: list[dict]) -> dict:
    n = len(rows)
    return {"n": n, "em": sum(r["em"] for r in rows) / n if n else 0.0, "f1": sum(r["f1"] for r in rows) / n if n else 0.0}


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    import torch

    from effrag.data import load_questions
    from effrag.evaluation.metrics import answer_rule, exact_match, f1
    from effrag.evaluation.report import md_table
    from effrag.hardware import usable_cores
    from effrag.models import load_reader
    from effrag.text import reader_passage

    torch.set_num_threads(args.threads or usable_cores())
    reader = load_reader(args.reader).eval()
    args.output.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    table = []
    files = []
    for ds in args.datasets:
        path = Path(args.data) / ds / "dev.jsonl"
        files.append(path)
        questions = [q for q in load_questions(path, limit=args.limit) if q.gold]
        rule = answer_rule(ds)
        preds = []
        t0 = time.perf_counter()
        for i, q in enumerate(questions, 1):
            passages = [reader_passage(p.title, p.text) for p in q.gold]
            row = {"id": q.id, "question": q.question, "answers": q.answers, "type": q.type,
                   "kind": answer_kind(q.answer)}
            for mode in args.modes:
                ans, window = reader.read(q.question, passages, together=mode == "together")
                row[mode] = {"answer": ans.answer, "answer_type": ans.answer_type,
                             "confidence": round(ans.confidence, 4), "window": window,
                             "em": exact_match(ans.answer, q.answers), "f1": f1(ans.answer, q.answers, rule)}
            preds.append(row)
            if i % 50 == 0 or i == len(questions):
                print(f"{ds}: {i}/{len(questions)} questions ({time.perf_counter() - t0:.0f}s)", file=sys.stderr,
                      flush=True)
        (args.output / f"predictions-{ds}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in preds))
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in preds:
            groups["all"].append(r)
            groups[f"answer: {r['kind']}"].append(r)
            if r["type"]:
                groups[f"type: {r['type']}"].append(r)
        results[ds] = {"rule": rule, "n": len(preds), "seconds": round(time.perf_counter() - t0, 1), "groups": {}}
        for g in sorted(groups, key=lambda g: (g != "all", g)):
            rows = groups[g]
            per_mode = {m: score_rows([r[m] for r in rows]) for m in args.modes}
            results[ds]["groups"][g] = per_mode
            table.append([ds, g, str(len(rows))] + [f"{100 * per_mode[m][k]:.1f}" for m in args.modes
                                                    for k in ("em", "f1")])
    cols = ["dataset", "questions", "n"] + [f"{m} {k}" for m in args.modes for k in ("EM", "F1")]
    command = "python scripts/eval_reader.py " + " ".join(argv if argv is not None else sys.argv[1:])
    files_note = ", ".join(f"{ds}: {r['n']} questions, {r['rule']} rule" for ds, r in results.items())
    decoding = describe_decoding(reader.decoding())
    md = (f"# Oracle reading: the reader given the gold passages\n\nReader `{args.reader}` (span decoding: "
          f"{decoding}; `scripts/tune_reader.py`); each dataset's dev file ({files_note}). "
          "`together`: the gold passages packed into windows of the reader's length, the most confident window "
          "answers; `each`: every passage read alone, the most confident answers. EM/F1 in %.\n\n"
          + md_table(cols, table) + f"\n\nCommand: `{command}`\n")
    write_report(args.output, md, {"results": results, "decoding": reader.decoding()}, args=args, argv=argv, prog="python scripts/eval_reader.py",
                 files=files, json_name="results.json", commit=commit)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
