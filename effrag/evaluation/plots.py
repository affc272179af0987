"""Recall against retrieved chunks per method, as in Figure 2 of the EfficientRAG paper (``effrag[plots]``).

    from effrag.evaluation.plots import write_report_plot
    write_report_plot(["runs/direct-r", "runs/efficientrag"], "runs/report")
    # -> runs/report/recall_vs_chunks.png and recall_vs_chunks.md

Rows are the metric entries of ``metrics.json`` (``method``, ``dataset``, ``recall``,
``avg_chunks``, optionally ``k``, ``retriever``). A method is one line per dataset
(one panel per dataset): Direct-R at several ``k`` traces a curve, an iterative
method run at several settings gives several points. The x axis (average chunks
per question) is log-scaled, so methods that reach a recall with fewer chunks sit
further left.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..integrity import writing
from ..state_files import write_text_atomic
from .report import md_table

__all__ = ["load_rows", "plot_recall_vs_chunks", "recall_table", "write_report_plot"]

_MARKERS = "osD^v<>pP*hX"


def load_rows(sources: Iterable[str | Path | dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows from dicts, ``metrics.json`` files, or run folders holding one.

    A run folder's ``config.json`` adds its method options to each row (``options``),
    so points of one method run at several settings can be told apart.
    """
    rows: list[dict[str, Any]] = []
    for src in sources:
        if isinstance(src, dict):
            rows.append(dict(src))
            continue
        path = Path(src)
        if path.is_dir():
            path = path / "metrics.json"
        if not path.is_file():
            raise FileNotFoundError(f"no metrics file: {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON: {e.msg} (line {e.lineno})") from None
        entries = data if isinstance(data, list) else [data]
        options: dict[str, Any] = {}
        cfg = path.parent / "config.json"
        if cfg.is_file():
            options = {k: v for k, v in (json.loads(cfg.read_text()).get("run", {}).get("method_options") or {}).items()
                       if v is not None}
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ValueError(f"{path}: entry {i} is a {type(e).__name__}, expected an object")
            rows.append({**e, "options": {**options, **e.get("options", {})}, "source": str(path)})
    return rows


def _usable(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(rows):
        missing = [f for f in ("method", "recall", "avg_chunks") if r.get(f) is None]
        if missing:
            raise ValueError(f"row {i} ({r.get('source', r.get('method', '?'))}) lacks {', '.join(missing)}")
        if r["avg_chunks"] <= 0:
            continue  # nothing retrieved: no place on a log axis
        out.append(r)
    if not out:
        raise ValueError("no rows with recall and a positive avg_chunks to plot")
    return out


def _series_name(r: dict[str, Any], multi_retriever: bool) -> str:
    return f"{r['method']} ({r['retriever']})" if multi_retriever and r.get("retriever") else r["method"]


def _point_label(r: dict[str, Any], varying: list[str]) -> str:
    return ", ".join(f"{k}={r['k'] if k == 'k' else r['options'].get(k)}" for k in varying)


def _series(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """dataset -> series name -> rows sorted by avg_chunks."""
    multi = len({r["retriever"] for r in rows if r.get("retriever")}) > 1
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[r.get("dataset") or "all"][_series_name(r, multi)].append({"options": {}, **r})
    for per_ds in out.values():
        for pts in per_ds.values():
            pts.sort(key=lambda r: (r["avg_chunks"], r["recall"]))
    return out


def _varying(points: list[dict[str, Any]]) -> list[str]:
    """The settings that differ between a series' points (k first), used as point labels."""
    if len(points) < 2:
        return []
    keys = ["k"] if len({p.get("k") for p in points}) > 1 else []
    opt_keys = sorted({k for p in points for k in p["options"]})
    return keys + [k for k in opt_keys if len({json.dumps(p["options"].get(k)) for p in points}) > 1]


def plot_recall_vs_chunks(rows: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Write a PNG of recall (%) against average chunks per question (log x), one line per method and dataset."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    data = _series(_usable(rows))
    names = sorted({n for per_ds in data.values() for n in per_ds})
    style = {n: (f"C{i % 10}", _MARKERS[i % len(_MARKERS)]) for i, n in enumerate(names)}
    fig = Figure(figsize=(5.2 * len(data) + 0.4, 4.2), dpi=150)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(data), squeeze=False)[0]
    for ax, (dataset, per_ds) in zip(axes, sorted(data.items())):
        for name, pts in sorted(per_ds.items()):
            color, marker = style[name]
            xs, ys = [p["avg_chunks"] for p in pts], [100 * p["recall"] for p in pts]
            ax.plot(xs, ys, color=color, marker=marker, markersize=6, linewidth=1.6, label=name)
            varying = _varying(pts)
            dense = len(pts) > 8  # a k = 1..20 sweep: label only k = 1, 2, 5, 10, 20, ... so labels stay legible
            for p, x, y in zip(pts, xs, ys):
                if varying and (not dense or p.get("k") in (1, 2, 5, 10, 20, 50, 100)):
                    ax.annotate(_point_label(p, varying), (x, y), textcoords="offset points", xytext=(4, -11),
                                fontsize=7, color=color)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.12)  # room for the point labels at both ends
        ax.set_xlabel("average retrieved chunks per question (log scale)")
        ax.set_ylabel("recall (%)")
        ax.set_title(dataset)
        ax.grid(True, which="major", alpha=0.3)
        lo, hi = min(100 * p["recall"] for v in per_ds.values() for p in v), \
            max(100 * p["recall"] for v in per_ds.values() for p in v)
        ax.set_ylim(max(0.0, lo - 8), min(100.0, hi + 8) if hi + 8 > lo else lo + 10)
        ax.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path):  # matplotlib's failed write (a full disk) names no file
        fig.savefig(path)
    return path


def recall_table(rows: Sequence[dict[str, Any]]) -> str:
    """The plotted points as a markdown table (dataset, method, settings, avg chunks, recall)."""
    body = []
    for dataset, per_ds in sorted(_series(_usable(rows)).items()):
        for name, pts in sorted(per_ds.items()):
            varying = _varying(pts) or (["k"] if pts[0].get("k") is not None else [])
            for p in pts:
                body.append([dataset, name, _point_label(p, varying) or "-", f"{p['avg_chunks']:.2f}",
                             f"{100 * p['recall']:.2f}"])
    return md_table(["dataset", "method", "setting", "avg chunks", "recall %"], body, "lllrr")


def write_report_plot(sources: Iterable[str | Path | dict[str, Any]], out_dir: str | Path,
                      name: str = "recall_vs_chunks", title: str | None = None) -> dict[str, Path]:
    """``<out_dir>/<name>.png`` and ``<name>.md`` (table + image link) from metric rows, files or run folders."""
    rows = load_rows(sources)
    out = Path(out_dir)
    png = plot_recall_vs_chunks(rows, out / f"{name}.png", title=title)
    md = out / f"{name}.md"
    head = f"# {title}\n\n" if title else "# Recall against retrieved chunks\n\n"
    with writing(md):
        write_text_atomic(md, head + f"![recall vs chunks]({png.name})\n\n" + recall_table(rows))
    return {"png": png, "md": md}
