"""Markdown tables of metric entries (``metrics.md``, benchmark reports)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

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
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |",
             "|" + "|".join("---" if f == "{}" else "---:" for _, _, f in cols) + "|"]
    for e in entries:
        lines.append("| " + " | ".join(_cell(e.get(k), f) for k, _, f in cols) + " |")
    return "\n".join(lines) + "\n"


def write_metrics_md(entries: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    path = Path(path)
    head = f"# {title}\n\n" if title else ""
    note = ""
    if any("latency_measured_at_k" in e for e in entries):
        note = (f"\nLatency: one retrieval at k={entries[0]['latency_measured_at_k']} per question, "
                "scored at every k (smaller k would not be slower to score, and barely faster to retrieve).\n")
    path.write_text(head + markdown_table(entries) + note)
    return path
