#!/usr/bin/env python
"""EfficientRAG vs Direct-R on dev files, from tuning runs: Table-2 shape, recall-vs-chunks curve and plot.

Reads each dataset's tuning folder (``scripts/tune_efficientrag.py --output DIR``: ``best.json`` = the
loop config chosen within the chunk budget, ``curve.json`` = Direct-R@1..30 on the same questions,
retriever and gold) and writes into ``--output``:

* ``table2.md``: Direct-R@7/10/20/30 next to EfficientRAG's recall / chunks with the chosen config,
  and whether the bar (recall >= Direct-R@``--bar-k`` within ``--budget`` chunks) is met;
* ``curve.md``: at every chunk count 1..10, Direct-R@k against the chosen config's pool cut at k chunks
  (``max_candidates=k``: one config, the cap varied), and whether EfficientRAG is ahead;
* ``recall_vs_chunks.png`` / ``.md``: the plot (``effrag.evaluation.plots``).

With ``--card DIR`` the same tables go into ``DIR/README.md`` (the checkpoint's model card, next to
``labeler/``, ``filter/`` and ``loop-<dataset>.json``).

    python scripts/efficientrag_report.py --tune hotpotqa=runs/tune/all-hotpotqa 2wikimqa=... musique=... \\
        --output reports/efficientrag/dev --card checkpoints/efficientrag-all
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effrag.evaluation.report import md_table

TABLE_KS = (7, 10, 20, 30)


def load_tuning(folder: Path) -> dict:
    out = {}
    for name in ("best.json", "curve.json"):
        path = folder / name
        if not path.is_file():
            raise SystemExit(f"{path}: missing (run scripts/tune_efficientrag.py --output {folder} first)")
        try:
            out[name.split(".")[0]] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}: not JSON ({e})") from None
    if not out["best"].get("curve"):
        raise SystemExit(f"{folder}/best.json has no 'curve': rerun the tuner (this version records it)")
    return out


def tables(runs: dict[str, dict], budget: float, bar_k: int) -> tuple[str, str, list[dict]]:
    t2_head = ["dataset (dev questions)", *(f"Direct-R@{k}" for k in TABLE_KS), "EfficientRAG recall / chunks",
               "seen recall / chunks", f"bar: >= Direct-R@{bar_k} with <= {budget:g} chunks"]
    t2_rows: list[list[str]] = []
    curve_rows: list[list[str]] = []
    rows: list[dict] = []
    for ds, run in runs.items():
        direct = {d["k"]: d for d in run["curve"]["direct_r"]}
        best, n = run["best"], run["curve"]["setup"]["n"]
        m = best["metrics"]
        met = m["recall"] >= direct[bar_k]["recall"] and m["avg_chunks"] <= budget
        seen = f"{100 * m['seen_recall']:.2f} / {m['avg_seen']:.1f}" if "seen_recall" in m else "-"
        t2_rows.append([f"{ds} ({n})", *(f"{100 * direct[k]['recall']:.2f}" for k in TABLE_KS),
                        f"**{100 * m['recall']:.2f} / {m['avg_chunks']:.2f}**", seen,
                        f"{'met' if met else 'missed'} ({100 * (m['recall'] - direct[bar_k]['recall']):+.2f})"])
        er = {c: (rec, ch) for c, rec, ch in best["curve"]}
        cells_d = [f"{100 * direct[k]['recall']:.1f}" for k in range(1, 11)]
        cells_e = [(f"**{100 * er[k][0]:.1f}**" if er[k][0] > direct[k]["recall"] else f"{100 * er[k][0]:.1f}")
                   + (f" ({er[k][1]:.1f})" if abs(er[k][1] - k) > 0.05 else "") if k in er else "-"
                   for k in range(1, 11)]
        curve_rows += [[f"{ds}: Direct-R@k", *cells_d], [f"{ds}: EfficientRAG, cap k", *cells_e]]
        for k, d in sorted(direct.items()):
            # no "k" key: the x axis already says how many chunks, and 30 point labels would hide the lines
            rows.append({"method": "direct-r (top k)", "dataset": ds, "recall": d["recall"], "avg_chunks": d["avg_chunks"]})
        for c, rec, ch in best["curve"]:
            rows.append({"method": "efficientrag (loop-<dataset>.json, pool cut at k)", "dataset": ds, "recall": rec,
                         "avg_chunks": ch})
    t2 = md_table(t2_head, t2_rows, "l" + "r" * len(TABLE_KS) + "rrc")
    curve = md_table(["dataset", *(f"{k}" for k in range(1, 11))], curve_rows, "l" + "r" * 10)
    return t2, curve, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tune", nargs="+", required=True, metavar="DATASET=DIR")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--budget", type=float, default=7.0, help="chunk budget of the bar (default 7)")
    p.add_argument("--bar-k", type=int, default=30, help="the bar: Direct-R at this k (default 30)")
    p.add_argument("--card", type=Path, help="checkpoint folder whose README.md gets the tables")
    args = p.parse_args(argv)
    runs = {}
    for item in args.tune:
        ds, sep, folder = item.partition("=")
        if not sep:
            p.error(f"--tune {item!r}: expected DATASET=DIR")
        runs[ds] = load_tuning(Path(folder))
    t2, curve, rows = tables(runs, args.budget, args.bar_k)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "table2.md").write_text(t2)
    curve_md = ("Recall % at k chunks: Direct-R@k vs the chosen loop config's pool cut at k "
                "(bold = EfficientRAG ahead; average chunks in brackets where the pool is smaller than k)\n\n" + curve)
    (args.output / "curve.md").write_text(curve_md)
    from effrag.evaluation.plots import write_report_plot

    try:
        write_report_plot(rows, args.output,
                          title="EfficientRAG (pool cut at k) vs Direct-R@k, dev files")
    except ImportError as e:  # matplotlib is the optional [plots] extra
        print(f"plot skipped: {e}", file=sys.stderr)
    print(t2 + "\n" + curve_md)
    if args.card:
        card = args.card / "README.md"
        head = card.read_text().split("\n## Dev figures")[0].rstrip() + "\n" if card.is_file() else \
            f"# {args.card.name}\n\nEfficientRAG Labeler (`labeler/`), Filter (`filter/`) and loop configs " \
            "(`loop-<dataset>.json`, tuned on each dev file).\n"
        configs = "\n".join(f"- `loop-{ds}.json`: " + json.dumps(
            {k: v for k, v in run["best"]["config"].items() if k not in ("batch_size", "bf16")}) for ds, run in runs.items())
        card.write_text(head + "\n## Dev figures (recall %, dense MiniLM retriever for both methods)\n\n" + t2
                        + "\n" + curve_md + "\n## Loop configs\n\n" + configs + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
