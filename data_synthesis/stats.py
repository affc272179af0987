"""Summary of a synthesis output directory, like the paper's Table 1 plus balance figures.

Computed from the files alone (so it is right after any number of resumed runs):
records per file and dataset, word-label balance (share of 1 labels) of positive
Labeler records and of Filter records, tag balance (share of <Continue>), item
outcomes, rejects by stage/reason, alignment failures and per-item notes.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from effrag.jsonl import read_jsonl

from .export import iter_records

ALIGN_REASONS = ("align", "coverage", "not_in", "missing")  # reject reasons that are alignment failures


def _new() -> dict[str, Any]:
    return {"questions": 0, "ok": 0, "rejected": 0, "labeler": 0, "labeler_pos": 0, "labeler_neg": 0,
            "filter": 0, "labeler_words": 0, "labeler_ones": 0, "filter_words": 0, "filter_ones": 0,
            "rejects": Counter(), "notes": Counter(), "sources": Counter()}


def compute_stats(out_dir: str | Path) -> dict[str, Any]:
    """Figures per dataset and for ``"all"``; JSON-ready."""
    out = Path(out_dir)
    per: dict[str, dict[str, Any]] = defaultdict(_new)
    for rec in read_jsonl(out / "done.jsonl"):
        for d in (per[rec["dataset"]], per["all"]):
            d["questions"] += 1
            d["ok" if rec.get("status", "ok") == "ok" else "rejected"] += 1
            d["notes"].update(rec.get("notes") or {})
    for rec in iter_records(out, "labeler"):  # dataset/ (--format arrow) and the JSONL log
        for d in (per[rec["dataset"]], per["all"]):
            d["labeler"] += 1
            d["sources"][rec.get("source", "?")] += 1
            if rec["tag"]:
                d["labeler_pos"] += 1
                d["labeler_words"] += len(rec["labels"])
                d["labeler_ones"] += sum(rec["labels"])
            else:
                d["labeler_neg"] += 1
    for rec in iter_records(out, "filter"):
        for d in (per[rec["dataset"]], per["all"]):
            d["filter"] += 1
            d["filter_words"] += len(rec["labels"])
            d["filter_ones"] += sum(rec["labels"])
    for rec in read_jsonl(out / "rejects.jsonl"):
        for d in (per[rec["dataset"]], per["all"]):
            d["rejects"][f"{rec['stage']}:{rec['reason']}"] += 1
    result: dict[str, Any] = {}
    for name in sorted(per, key=lambda n: (n == "all", n)):
        d = per[name]
        rejects = dict(d.pop("rejects").most_common())
        result[name] = {
            **{k: v for k, v in d.items() if not k.endswith(("_words", "_ones")) and not isinstance(v, Counter)},
            "labeler_label_frac": round(d["labeler_ones"] / d["labeler_words"], 4) if d["labeler_words"] else None,
            "filter_label_frac": round(d["filter_ones"] / d["filter_words"], 4) if d["filter_words"] else None,
            "tag_continue_frac": round(d["labeler_pos"] / d["labeler"], 4) if d["labeler"] else None,
            "mean_chunk_words": round(d["labeler_words"] / d["labeler_pos"], 1) if d["labeler_pos"] else None,
            "rejects": rejects,
            "alignment_failures": sum(n for r, n in rejects.items() if any(a in r for a in ALIGN_REASONS)),
            "notes": dict(d["notes"].most_common()),
            "sources": dict(d["sources"]),
        }
    return result


def format_table(stats: dict[str, Any]) -> str:
    cols = [("dataset", None), ("questions", "questions"), ("ok", "ok"), ("rejected", "rejected"),
            ("labeler", "labeler"), ("+tag", "labeler_pos"), ("-tag", "labeler_neg"), ("filter", "filter"),
            ("lab 1s", "labeler_label_frac"), ("filt 1s", "filter_label_frac"), ("cont", "tag_continue_frac"),
            ("align fail", "alignment_failures")]
    rows = [[h for h, _ in cols]]
    for name, d in stats.items():
        rows.append([name] + ["-" if d.get(k) is None else f"{d[k]:.3f}" if isinstance(d[k], float)
                              else str(d[k]) for _, k in cols[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, d in stats.items():
        if d["rejects"]:
            lines.append(f"rejects {name}: " + ", ".join(f"{r}={n}" for r, n in d["rejects"].items()))
        if d["notes"]:
            lines.append(f"notes   {name}: " + ", ".join(f"{r}={n}" for r, n in d["notes"].items()))
    return "\n".join(lines)


def write_stats(out_dir: str | Path) -> dict[str, Any]:
    """Compute the stats of ``out_dir`` and write ``stats.json`` there."""
    stats = compute_stats(out_dir)
    from effrag.state_files import write_json_atomic

    write_json_atomic(Path(out_dir) / "stats.json", stats, indent=2)
    return stats
