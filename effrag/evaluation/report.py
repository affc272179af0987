"""Markdown tables: metric entries (``metrics.md``) and any report's rows (:func:`md_table`).

The one markdown table writer of the project: benchmark, tuning and model-card scripts build
their rows and call :func:`md_table` rather than formatting pipes themselves.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (key, header, format) in display order; a column is shown when some entry has the key.
_COLUMNS = [
    ("method", "method", "{}"), ("dataset", "dataset", "{}"), ("retriever", "retriever", "{}"),
    ("k", "k", "{}"), ("n", "n", "{}"), ("recall", "recall %", "pct"), ("avg_chunks", "avg chunks", "{:.2f}"),
    ("em", "EM %", "pct"), ("f1", "F1 %", "pct"), ("cover_em", "cover-EM %", "pct"),
    ("latency_s", "latency s/q", "{:.4f}"), ("llm_calls", "LLM calls", "{:.2f}"),
    ("prompt_tokens", "prompt tok", "{:.0f}"), ("completion_tokens", "compl. tok", "{:.0f}"),
    ("iterations", "iterations", "{:.2f}"),
]
_ZERO_HIDDEN = {"llm_calls", "prompt_tokens", "completion_tokens"}


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | Sequence[str] = "") -> str:
    """A GitHub markdown table. ``align`` per column: ``"l"`` (``---``), ``"r"`` (``---:``) or ``"c"`` (``:---:``);
    a string like ``"lrr"`` or a list; missing columns align left. Cells are ``str()``-ed, ``None`` is ``-``."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = list(align) + ["l"] * (len(header) - len(align))
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(marks[a] for a in align[: len(header)]) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row has {len(row)} cells for {len(header)} columns: {row!r}")
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "pct":
        return f"{100 * value:.2f}"
    return fmt.format(value)


def markdown_table(entries: Sequence[dict[str, Any]]) -> str:
    """A GitHub markdown table of ``entries`` (columns that no entry has, or all-zero LLM cost, are left out)."""
    cols = [c for c in _COLUMNS if any(c[0] in e for e in entries)
            and not (c[0] in _ZERO_HIDDEN and all(not e.get(c[0]) for e in entries))]
    return md_table([h for _, h, _ in cols], [[_cell(e.get(k), f) for k, _, f in cols] for e in entries],
                    ["l" if f == "{}" else "r" for _, _, f in cols])


def write_metrics_md(entries: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    path = Path(path)
    head = f"# {title}\n\n" if title else ""
    note = ""
    if any("latency_measured_at_k" in e for e in entries):
        note = (f"\nLatency: one retrieval at k={entries[0]['latency_measured_at_k']} per question, "
                "scored at every k (smaller k would not be slower to score, and barely faster to retrieve).\n")
    from effrag.state_files import write_text_atomic

    write_text_atomic(path, head + markdown_table(entries) + note)
    return path
