#!/usr/bin/env python
"""Two runs of ``effrag eval`` on the same questions, compared question by question: recall at k chunks of each,
and the mean and standard error of their per-question difference (B minus A).

Why paired: on a few dozen questions the two runs' recalls each move by a passage or two, but most questions score
the same under both, so the per-question difference has a much smaller error than either figure. It is how a small
held-out set (the quickstart's 30 bundled questions per dataset) re-checks a config chosen on the dev file.

    python scripts/paired_recall.py runs/cmp/old runs/cmp/new --k 5 7 10
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from effrag.evaluation import read_predictions
from effrag.evaluation.metrics import recall
from effrag.tuning.crossfit import standard_error


def at_k(run: Path, k: int) -> dict[str, float]:
    """Question id -> recall of the run's first ``k`` chunks."""
    return {p.qid: recall([c.id for c in p.result.chunks[:k]], p.gold) for p in read_predictions(run / "predictions.jsonl")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="an effrag eval output folder (the baseline)")
    p.add_argument("b", type=Path, help="another, on the same questions")
    p.add_argument("--k", type=int, nargs="+", default=[5, 7, 10])
    args = p.parse_args(argv)
    for k in args.k:
        a, b = at_k(args.a, k), at_k(args.b, k)
        if set(a) != set(b):
            p.error(f"{args.a} and {args.b} hold different questions ({len(set(a) ^ set(b))} in one only)")
        diff = [b[q] - a[q] for q in sorted(a)]
        print(f"<= {k}: A {100 * sum(a.values()) / len(a):.1f}  B {100 * sum(b.values()) / len(b):.1f}  "
              f"B - A {100 * sum(diff) / len(diff):+.1f} ± {100 * standard_error(diff):.1f} (n {len(diff)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
