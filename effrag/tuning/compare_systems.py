"""Two EfficientRAG systems' loop configs side by side: does a recipe run make what ships?

Issue #71 asks that ``bash scripts/train_efficientrag.sh all`` either make the shipped files, or come within noise
of them: **the same picks** (every option of each loop config, its ranker, retriever and encoder, and whether the
set-wise ranker reorders the pool) and **every cross-fitted recall within one point**. Weights are not compared:
two trainings never give the same bits, and what they are for is the recall the loop configs record.
"""
from __future__ import annotations

import json
from pathlib import Path

from effrag.pretrained import LOOP_FILES

TOLERANCE = 0.01  # one point of recall


def _pick(cfg: dict) -> dict:
    """What a loop file picked: its options and the fields beside them that change what the loop reads."""
    return {**cfg["config"], **{k: cfg.get(k) for k in ("retriever", "encoder", "ranker")}}


def compare_loop_file(a: dict, b: dict, tolerance: float = TOLERANCE) -> dict:
    """One loop file of system A against the same file of B: the options that differ (``{name: [a, b]}``) and each
    dataset's cross-fitted recall at each budget (``{dataset: {budget: [a, b]}}``), with the verdicts."""
    pa, pb = _pick(a), _pick(b)
    differ = {k: [pa.get(k), pb.get(k)] for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)}
    recall: dict[str, dict[str, list]] = {}
    for ds in sorted(set(a.get("crossfit") or {}) | set(b.get("crossfit") or {})):
        ra = ((a.get("crossfit") or {}).get(ds) or {}).get("recall", {})
        rb = ((b.get("crossfit") or {}).get(ds) or {}).get("recall", {})
        recall[ds] = {k: [ra.get(k), rb.get(k)] for k in sorted(set(ra) | set(rb), key=int)}
    within = all(x is not None and y is not None and abs(x - y) <= tolerance + 1e-9
                 for by_k in recall.values() for x, y in by_k.values())
    return {"differ": differ, "recall": recall, "same_pick": not differ, "within": bool(recall) and within}


def compare_systems(a: str | Path, b: str | Path, tolerance: float = TOLERANCE) -> dict:
    """Every loop file of A and B compared (:func:`compare_loop_file`); ``verdict`` is true when all four have the
    same pick and every cross-fitted recall within ``tolerance``. A file missing from either side is an error."""
    files = {}
    for name in LOOP_FILES:
        pair = []
        for folder in (Path(a), Path(b)):
            path = folder / name
            try:
                pair.append(json.loads(path.read_text()))
            except FileNotFoundError:
                raise FileNotFoundError(f"{path}: no such loop config (a system folder holds {', '.join(LOOP_FILES)})")
            except (json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{path}: not a loop config ({e})") from None
        try:
            files[name] = compare_loop_file(*pair, tolerance=tolerance)
        except KeyError as e:
            raise ValueError(f"{Path(a) / name} or {Path(b) / name}: no {e} field (not a loop config)") from None
    verdict = all(f["same_pick"] and f["within"] for f in files.values())
    return {"a": str(a), "b": str(b), "tolerance": tolerance, "files": files, "verdict": verdict}


def comparison_markdown(result: dict, a_name: str = "A", b_name: str = "B") -> str:
    """The comparison as a report: one row per (file, dataset), then the options that differ."""
    pts = 100 * result["tolerance"]
    lines = [f"# {a_name} against {b_name}: the same picks, and every cross-fitted recall within {pts:.0f} point?",
             "", f"**{'Yes' if result['verdict'] else 'No'}.** A: `{a_name}`; B: `{b_name}`. Recall in %.", "",
             "| loop file | dev file | same pick | recall A (7 / 10) | recall B (7 / 10) | A - B | within |",
             "|---|---|---|---|---|---|---|"]
    notes = []
    for name, f in result["files"].items():
        for ds, by_k in f["recall"].items():
            fig = {side: " / ".join("-" if v[side] is None else f"{100 * v[side]:.1f}" for v in by_k.values())
                   for side in (0, 1)}
            diff = " / ".join("-" if None in v else f"{100 * (v[0] - v[1]):+.1f}" for v in by_k.values())
            ok = all(None not in v and abs(v[0] - v[1]) <= result["tolerance"] + 1e-9 for v in by_k.values())
            lines.append(f"| `{name}` | {ds} | {'yes' if f['same_pick'] else 'no'} | {fig[0]} | {fig[1]} | {diff} | "
                         f"{'yes' if ok else 'no'} |")
        if f["differ"]:
            notes.append(f"- `{name}`: " + "; ".join(f"{k} {json.dumps(v[0])} against {json.dumps(v[1])}"
                                                    for k, v in f["differ"].items()))
    if notes:
        lines += ["", "Options that differ (A against B):", "", *notes]
    return "\n".join(lines) + "\n"
