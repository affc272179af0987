"""Tune the extractive reader's span decoding on the dev files' oracle reading, and optionally store it.

    python scripts/tune_reader.py --reader checkpoints/reader-all --output reports/reader/decoding [--write]

The command line of :mod:`effrag.tuning.reader` (its module doc says what is tuned and why the objective is F1
over all dev questions pooled). Only dev questions are used; the report holds every grid point. ``--write``
stores the best settings in the checkpoint's ``options``, with this run's provenance, so ``effrag eval --reader
DIR`` and every other user of the reader decode with them.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def ints(text: str) -> list[int]:
    return [int(x) for x in floats(text)]


def parse_args(argv=None):
    from effrag.cli_args import add_data_args, add_output_arg, add_reader_arg, add_source_args, add_threads_arg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reader_arg(ap, required=True)
    add_data_args(ap)
    ap.add_argument("--echo-penalties", type=floats, default=floats("0,1,2,4,8,10000"))
    ap.add_argument("--length-penalties", type=floats, default=floats("0,0.1,0.2,0.4,0.6,0.8"))
    ap.add_argument("--max-answer-tokens", type=ints, default=ints("15,30"))
    ap.add_argument("--yes-biases", type=floats, default=floats("0,1,2,3"))
    add_threads_arg(ap)
    ap.add_argument("--write", action="store_true", help="store the best settings in the checkpoint")
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source, write_report

    commit = report_source(args.output, args.allow_dirty)
    import torch

    from effrag.hardware import usable_cores
    from effrag.models.reader import load_reader_checkpoint
    from effrag.tuning.reader import dev_logits, store_decoding, tune_decoding, tuning_report

    torch.set_num_threads(args.threads or usable_cores())
    reader = load_reader_checkpoint(args.reader).eval()
    try:
        cache = dev_logits(reader, args.data, args.datasets, args.limit)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(str(e)) from None
    tuned = tune_decoding(reader, cache, max_answer_tokens=args.max_answer_tokens, echo_penalties=args.echo_penalties,
                          length_penalties=args.length_penalties, yes_biases=args.yes_biases)
    command = "python scripts/tune_reader.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = tuning_report(args.reader, tuned, args.datasets, {ds: len(rows) for ds, rows in cache.items()}, command,
                       args.write)
    files = [Path(args.data) / ds / "dev.jsonl" for ds in args.datasets]
    best = tuned["best"]
    write_report(args.output, md, {"best": best, "checkpoint_before": tuned["start"], "grid": tuned["rows"]},
                 args=args, argv=argv, prog="python scripts/tune_reader.py", files=files, commit=commit)
    if args.write:
        store_decoding(Path(args.reader), best["settings"],
                       {"command": command, "objective": "dev oracle F1, all questions pooled", "f1": round(best["f1"], 2),
                        "before": tuned["start"]["settings"], "report": str(args.output), "commit": commit})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
