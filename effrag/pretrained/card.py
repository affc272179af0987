"""The rendered blocks that more than one writer fills, in the shipped system's card and in the README.

A block stands between two comments, :func:`markers`. Export writes the card's ``headline`` block with its loop files'
cross-fitted table, :func:`crossfit_table`. ``scripts/efficientrag_report.py --system`` writes a cross-fitting
report's tables into the ``dev-figures`` block, :func:`dev_figures_markdown`. ``effrag.headline`` renders both from
the committed evidence and fails when either is stale. Each writer reads its format from here, so they cannot drift.
"""
from __future__ import annotations


def markers(name: str = "headline") -> tuple[str, str]:
    """The comments a rendered block of ``name`` stands between."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_block(text: str, block: str, name: str = "headline") -> str:
    """``text`` with what stands between ``name``'s markers replaced by ``block``."""
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block to write into")
    head, rest = text.split(start, 1)
    return head + start + "\n" + block + rest[rest.index(end):]


def crossfit_table(loops: dict[str, dict]) -> str:
    """Each loop file's cross-fitted figures, one row per file and dev file (``loops``: file name -> content)."""
    rows = []
    for name, cfg in loops.items():
        for ds, fig in (cfg.get("crossfit") or {}).items():
            rec = fig["recall"]
            rows.append(f"| `{name}` | {ds} | {fig['n']} | {100 * rec['7']:.1f} | {100 * rec['10']:.1f} | "
                        f"{' / '.join(f'{x:.0f}' for x in fig['forwards'])} |")
    return "\n".join(["| config | dev file | questions | <= 7 chunks | <= 10 chunks | read per question "
                      "(Labeler / ranker / Filter) |", "|---|---|---:|---:|---:|---|", *rows])


def dev_figures_markdown(table2: str, curve: str) -> str:
    """The card's dev figures: a cross-fitting report's ``table2.md`` and the table of its ``curve.md``."""
    return table2.rstrip("\n") + "\n\n### Recall at 1..10 chunks\n\n" + curve.split("\n\n", 1)[1].rstrip("\n") + "\n"
