"""The evidence behind a cross-fitted report, small enough to commit: one gzipped JSON file per dev file.

A tuning folder's ``results.jsonl`` (every config's per-question pool positions, 4-30 MB) and the Direct-R runs
over the dev files are what ``scripts/efficientrag_report.py`` chooses and scores from; neither is in git, so a
reader could not recompute a headline. ``<report>/evidence/<dataset>.json.gz`` keeps exactly what the report
reads: each row's config and per-question scores (each tuning folder's setup once, without machine paths), the
Direct-R recall
curve of each retriever and its per-question recall at the target depths, and the ranker's read factor (one per
ranker folder when the rows come from several rankers).
``efficientrag_report.py --evidence DIR`` rebuilds every table from these files alone, from a fresh clone with no
data folder and no tuning run.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = 1


def write_gz_json(path: str | Path, data: Any) -> Path:
    """``data`` as gzipped compact JSON at ``path``, written whole or not at all (a ``.partial`` file renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from ..state_files import atomic_path

    with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(data, separators=(",", ":")))
    return path


def read_gz_json(path: str | Path, what: str, fmt: int = FORMAT) -> dict[str, Any]:
    """A file :func:`write_gz_json` wrote, of format ``fmt`` with ``rows``; a damaged or foreign file is one error
    naming it (``what``: the kind of file expected)."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a readable evidence file ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt or not data.get("rows"):
        raise ValueError(f"{path}: not {what} of format {fmt}")
    return data


def write_evidence(path: str | Path, dataset: str, rows: list[dict], direct: Mapping, per_question: Mapping,
                   ranker_factor: float | Mapping[str, float] = 1.0) -> Path:
    """Write one dev file's evidence (rows as :func:`.loop_configs.read_rows` gives them)."""
    from .loop_configs import portable_setup

    setups: list[dict] = []  # one per tuning folder the rows came from (each ranker's its own)
    index = []
    for r in rows:
        setup = portable_setup(r["setup"])
        if setup not in setups:
            setups.append(setup)
        index.append(setups.index(setup))
    data = {"format": FORMAT, "dataset": dataset, "setups": setups,
            "ranker_factor": dict(ranker_factor) if isinstance(ranker_factor, Mapping) else ranker_factor,
            "rows": [{"config": r["config"], "changes": r.get("changes"), "per_question": r["per_question"],
                      "setup": i} for r, i in zip(rows, index)],
            "direct_r": {kind: {str(k): v for k, v in curve.items()} for kind, curve in direct.items()},
            "direct_r_per_question": {kind: {str(k): v for k, v in by_k.items()} for kind, by_k in per_question.items()}}
    return write_gz_json(path, data)


def read_evidence(path: str | Path) -> dict[str, Any]:
    """``{"dataset", "rows" (each with its setup), "direct_r": {kind: {k: recall}}, "direct_r_per_question": {kind:
    {k: {qid: recall}}}, "ranker_factor"}``; a damaged or foreign file is one error naming it."""
    data = read_gz_json(path, "an effrag evidence file")
    data["rows"] = [{**r, "setup": data["setups"][r["setup"]]} for r in data["rows"]]
    data["direct_r"] = {kind: {int(k): v for k, v in curve.items()} for kind, curve in data["direct_r"].items()}
    data["direct_r_per_question"] = {kind: {int(k): v for k, v in by_k.items()}
                                     for kind, by_k in data["direct_r_per_question"].items()}
    return data
