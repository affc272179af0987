"""Tune IRRR's query-word and answerability thresholds on dev questions: the command line of
:func:`effrag.tuning.irrr.tune_irrr` (its module doc says how the grid is run once and replayed). Writes
``OUT/grid.json``, ``OUT/table.md`` and ``OUT/best.json`` (an ``--irrr-config`` for ``bench_irrr.py``).

    python scripts/tune_irrr.py --irrr checkpoints/irrr-all --data ../shared/data --limit 40 --output runs/tune_irrr
    python scripts/tune_irrr.py --irrr checkpoints/irrr-all --limit 100 --first-k 5 10 --return-k 10 \
        --objective recall --output runs/tune_irrr_recall
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def parse_args(argv=None) -> argparse.Namespace:
    from effrag.cli_args import (
        add_data_args,
        add_irrr_arg,
        add_limit_arg,
        add_output_arg,
        add_source_args,
        add_threads_arg,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_irrr_arg(ap, required=True)
    g = add_data_args(ap, limit=False)
    add_limit_arg(g, 40, help="first N dev questions per dataset")
    ap.add_argument("--query-thresholds", type=float, nargs="+", default=[0.2, 0.35, 0.5])
    ap.add_argument("--answer-thresholds", type=float, nargs="+", default=[-4, -2, -1, 0, 1, 2, 3, 4, 6])
    ap.add_argument("--max-path", type=int, default=4)
    ap.add_argument("--k", type=int, default=5, help="candidates per step")
    ap.add_argument("--first-k", type=int, nargs="+", default=[None],
                    help="candidates at the first step (grid; default: --k)")
    ap.add_argument("--return-k", type=int, default=None,
                    help="fill the returned paragraphs up to this many (default: path only)")
    ap.add_argument("--fill-order", nargs="+", choices=["rerank", "retrieval"], default=["rerank"],
                    help="orders of the --return-k fill to replay (grid; no rerun)")
    ap.add_argument("--objective", choices=["f1", "recall"], default="f1")
    add_threads_arg(ap, 1)
    add_output_arg(ap, required=True)
    add_source_args(ap)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from effrag.provenance import report_source

    commit = report_source(args.output, args.allow_dirty)  # best.json feeds reports: from committed code
    import torch

    from effrag.models import IRRRModel
    from effrag.tuning.irrr import tune_irrr

    torch.set_num_threads(args.threads)
    out = tune_irrr(IRRRModel.from_pretrained(args.irrr).eval(), args.data, args.output, datasets=args.datasets,
                    limit=args.limit, query_thresholds=args.query_thresholds, answer_thresholds=args.answer_thresholds,
                    max_path=args.max_path, k=args.k, first_ks=args.first_k, return_k=args.return_k,
                    fill_orders=args.fill_order, objective=args.objective,
                    settings={**{k: str(v) for k, v in vars(args).items()}, "commit": commit})
    for e in out["ranked"][:8]:
        print(f"q={e['query_threshold']} fk={e['first_k']} a={e['answer_threshold']} fill={e['fill_order']}: "
              f"mean F1 {e['f1']:.3f}, recall {e['recall']:.3f}, read {e['read']:.1f}; "
              + ", ".join(f"{ds} F1 {e[ds]['f1']:.3f} R {e[ds]['recall']:.3f} steps {e[ds]['steps']:.2f}"
                          for ds in args.datasets))
    print("best:", json.dumps(out["config"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
