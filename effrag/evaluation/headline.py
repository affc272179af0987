"""The README's results table, read from the committed evidence a spec names (``reports/headline.json``).

A headline figure is kept once: in the report that measured it. The spec names those reports (the cross-fitted
recall of the shipped loop configs, the loop-cost benches, the index-cost bench) and this module reads each figure
off them, so the table cannot drift from its evidence; ``scripts/render_headline.py`` writes it into the README and
``tests/test_headline.py`` fails when the README is stale. Anchor: pyserini's ``2cr`` figures kept as data.
"""
from __future__ import annotations

import json
from pathlib import Path

START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def _bar_name(name: str) -> str:
    """A baseline as the README names it: ``hybrid-e5-small`` is ``hybrid-e5``; ``-own-k`` (the hybrid that fuses
    each leg's own top k, which the report takes where it beats the fused top 30 cut at k) is the hybrid."""
    return name.removesuffix("-own-k").replace("-e5-small", "-e5")


def headline_rows(spec: dict, root: str | Path) -> list[dict]:
    """One row per dataset of ``spec``: the shipped ``loop-<dataset>.json``'s cross-fitted recall at 5, 7 and 10
    chunks and its reads, the strongest Direct-R at 20 and 30, the benched cost per question and the index time.
    A shipped file whose recall differs from the evidence's is an error: the evidence no longer makes it."""
    from effrag.tuning.loop_cost import single_ratio

    root = Path(root)
    crossfit = json.loads((root / spec["recall"]["evidence"]).read_text())
    index_report = json.loads((root / spec["index"]["evidence"]).read_text())
    index = {d["dataset"]: d for d in index_report["datasets"]}
    rows = []
    for ds, name in spec["datasets"].items():
        shipped = json.loads((root / spec["system"] / f"loop-{ds}.json").read_text())["crossfit"][ds]
        own = crossfit["per_dataset"][ds]
        fig = (crossfit["general"] if own["ships"] == "loop.json" else own)["crossfit"]["datasets"][ds]
        if {k: round(v, 4) for k, v in fig["recall"].items()} != {k: round(v, 4) for k, v in shipped["recall"].items()}:
            raise ValueError(f"{spec['system']}/loop-{ds}.json: its cross-fitted recall {shipped['recall']} is not "
                             f"the evidence's {fig['recall']} ({spec['recall']['evidence']})")
        bench = json.loads((root / spec["cost"]["benches"][ds]).read_text())
        (shipped_row,) = [r for r in bench["rows"] if r["name"] == "shipped"]
        (total,) = [r for r in index[ds]["rows"] if r["row"] == "shipped total"]
        rows.append({
            "dataset": ds, "name": name, "n": fig["n"],
            "bar": {b: (own["margins"][b]["bar_recall"], _bar_name(own["margins"][b]["bar"])) for b in ("7", "10")},
            "recall": {"5": fig["curve"][4][1], "7": fig["recall"]["7"], "10": fig["recall"]["10"]},
            "forwards": fig["forwards"], "pfe": (shipped_row["ratio"], single_ratio(shipped_row)),
            "index_pfe": total["pfe_per_1k"], "cost_commit": bench["commit"], "index_commit": index_report["commit"]})
    return rows


def headline_markdown(spec: dict, root: str | Path) -> str:
    """The table and one line of sources, as the README holds them between :data:`START` and :data:`END`."""
    rows = headline_rows(spec, root)
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    lines = ["| dataset (questions) | strongest Direct-R@20 | EfficientRAG <= 7 chunks | strongest Direct-R@30 | "
             "EfficientRAG <= 10 chunks | <= 5 chunks | reads per question (Labeler / ranker / Filter) | "
             "pfe/q batched / one at a time | index time, pfe per 1k chunks |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        lead = {b: r["recall"][b] - r["bar"][b][0] for b in ("7", "10")}
        lines.append(
            f"| {r['name']} ({r['n']}) | {pct(r['bar']['7'][0])} ({r['bar']['7'][1]}) | **{pct(r['recall']['7'])}** "
            f"({100 * lead['7']:+.1f}) | {pct(r['bar']['10'][0])} ({r['bar']['10'][1]}) | **{pct(r['recall']['10'])}** "
            f"({100 * lead['10']:+.1f}) | {pct(r['recall']['5'])} | {' / '.join(f'{x:.1f}' for x in r['forwards'])} | "
            f"{r['pfe'][0]:.1f} / {r['pfe'][1]:.1f} | {r['index_pfe']:,.0f} |")
    commits = sorted({r["cost_commit"] for r in rows})
    index_commits = sorted({r["index_commit"] for r in rows})
    sources = (f"Recall: [{Path(spec['recall']['report']).parent.as_posix()}/]({spec['recall']['report']}), "
               f"{spec['recall']['date']}. Cost per question: [loop-cost]({spec['cost']['report']}) benches "
               f"`{'`, `'.join(Path(b).parent.name for b in spec['cost']['benches'].values())}`, commit "
               f"{', '.join(commits)}. Index time: [index-cost]({spec['index']['report']}), commit "
               f"{', '.join(index_commits)}. 2 CPU cores. Generated from `reports/headline.json` by "
               f"`python scripts/render_headline.py`.")
    return "\n".join(lines) + "\n\n" + sources + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with what stands between the headline markers replaced by ``block``."""
    if START not in text or END not in text:
        raise ValueError(f"no {START} ... {END} block to write the table into")
    head, rest = text.split(START, 1)
    return head + START + "\n" + block + rest[rest.index(END):]
