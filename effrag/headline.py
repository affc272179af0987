"""The headline figures, read from the committed evidence a spec names (``reports/headline.json``).

A headline figure is kept once: in the report that measured it. The spec names those reports (the cross-fitted
recall of the shipped loop configs, the loop-cost benches, the index-cost bench, the quickstart's committed output)
and this module reads each figure off them, so no rendered text can drift from its evidence. It renders three
things: the README's results table, the shipped system's card (its figures and its cost) and the README's copy of
what ``effrag quickstart`` prints. Each sits between a pair of markers (:mod:`effrag.pretrained.card`, whose
formats export and the report script write too); ``scripts/render_headline.py`` writes them and
``tests/test_headline.py`` fails when one is stale. It reads the reports and the quickstart's table, so it stands
with the front ends. Anchor: pyserini's ``2cr`` figures kept as data.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from effrag.pretrained.card import crossfit_table, dev_figures_markdown, markers, replace_block

START, END = markers("headline")
RUN_FIELDS = ("config", "retriever", "encoder", "ranker")  # what a loop file's run depends on (its figures do not)


def _bar_name(name: str) -> str:
    """A baseline as the README names it: ``hybrid-e5-small`` is ``hybrid-e5``; ``-own-k`` (the hybrid that fuses
    each leg's own top k, which the report takes where it beats the fused top 30 cut at k) is the hybrid."""
    return name.removesuffix("-own-k").replace("-e5-small", "-e5")


def _loop(spec: dict, root: Path, name: str) -> dict:
    return json.loads((root / spec["system"] / name).read_text())


def _same_recall(shipped: dict, fig: dict, where: str, evidence: str) -> None:
    if {k: round(v, 4) for k, v in fig["recall"].items()} != {k: round(v, 4) for k, v in shipped["recall"].items()}:
        raise ValueError(f"{where}: its cross-fitted recall {shipped['recall']} is not the evidence's {fig['recall']} "
                         f"({evidence})")


def _shipped_bench(root: Path, path: str, loop: dict, where: str) -> tuple[dict, dict]:
    """A cost bench of ``loop`` (a loop file's content) and its ``shipped`` row; a bench of another config or ranker
    is an error: it no longer measures what ships."""
    bench = json.loads((root / path).read_text())
    setup = bench["setup"]
    if setup.get("base_config") != loop["config"] or setup.get("ranker") != loop.get("ranker"):
        raise ValueError(f"{path}: it benched another config or ranker than {where} ships")
    (row,) = [r for r in bench["rows"] if r["name"] == "shipped"]
    return bench, row


def headline_rows(spec: dict, root: str | Path) -> list[dict]:
    """One row per dataset of ``spec``: the shipped ``loop-<dataset>.json``'s cross-fitted recall at 5, 7 and 10
    chunks and its reads, the strongest Direct-R at 20 and 30, the benched cost per question and the index time.
    A shipped file whose recall differs from the evidence's, or whose config its bench did not run, is an error:
    the evidence no longer makes it."""
    from effrag.tuning.loop_cost import single_ratio

    root = Path(root)
    crossfit = json.loads((root / spec["recall"]["evidence"]).read_text())
    index_report = json.loads((root / spec["index"]["evidence"]).read_text())
    index = {d["dataset"]: d for d in index_report["datasets"]}
    rows = []
    for ds, name in spec["datasets"].items():
        where = f"{spec['system']}/loop-{ds}.json"
        loop = _loop(spec, root, f"loop-{ds}.json")
        shipped = loop["crossfit"][ds]
        own = crossfit["per_dataset"][ds]
        fig = (crossfit["general"] if own["ships"] == "loop.json" else own)["crossfit"]["datasets"][ds]
        _same_recall(shipped, fig, where, spec["recall"]["evidence"])
        bench, shipped_row = _shipped_bench(root, spec["cost"]["benches"][ds], loop, where)
        (total,) = [r for r in index[ds]["rows"] if r["row"] == "shipped total"]
        rows.append({
            "dataset": ds, "name": name, "n": fig["n"],
            "bar": {b: (own["margins"][b]["bar_recall"], _bar_name(own["margins"][b]["bar"])) for b in ("7", "10")},
            "recall": {"5": fig["curve"][4][1], "7": fig["recall"]["7"], "10": fig["recall"]["10"]},
            "forwards": fig["forwards"], "pfe": (shipped_row["ratio"], single_ratio(shipped_row)),
            "threads": bench["setup"]["threads"], "batch": bench["setup"]["batch"],
            "index_pfe": total["pfe_per_1k"], "cost_commit": bench["commit"], "index_commit": index_report["commit"]})
    return rows


def _cores(rows: list[dict]) -> str:
    return "/".join(str(t) for t in sorted({r["threads"] for r in rows})) + " CPU cores"


def headline_markdown(spec: dict, root: str | Path, rows: list[dict] | None = None) -> str:
    """The table and one line of sources, as the README holds them between :data:`START` and :data:`END`
    (``rows``: :func:`headline_rows`, when already read)."""
    rows = rows if rows is not None else headline_rows(spec, root)
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
               f"{', '.join(index_commits)}. {_cores(rows)}. Generated from `reports/headline.json` by "
               f"`python scripts/render_headline.py`.")
    return "\n".join(lines) + "\n\n" + sources + "\n"


def card_markdown(spec: dict, root: str | Path, rows: list[dict] | None = None) -> str:
    """The shipped system's card between its headline markers: each loop file's cross-fitted figures and the cost
    of each. The table is :func:`effrag.pretrained.card.crossfit_table`, which the card's export writes too.
    ``loop.json``'s recall must be the evidence's joint pick, and each cost bench must have run the config it costs."""
    from effrag.pretrained import LOOP_FILES
    from effrag.tuning.loop_cost import single_ratio

    root = Path(root)
    rows = rows if rows is not None else headline_rows(spec, root)
    loops = {name: _loop(spec, root, name) for name in LOOP_FILES}
    crossfit = json.loads((root / spec["recall"]["evidence"]).read_text())
    for ds, fig in loops["loop.json"]["crossfit"].items():
        _same_recall(fig, crossfit["general"]["crossfit"]["datasets"][ds], f"{spec['system']}/loop.json",
                     spec["recall"]["evidence"])
    general = []
    for ds, path in spec["cost"]["general"].items():
        bench, row = _shipped_bench(root, path, loops["loop.json"], f"{spec['system']}/loop.json")
        general.append((spec["datasets"][ds], row, bench))
    cost = ", ".join([f"`loop-{r['dataset']}.json` {r['pfe'][0]:.1f} / {r['pfe'][1]:.1f}" for r in rows]
                     + ["`loop.json` " + " and ".join(f"{row['ratio']:.1f} / {single_ratio(row):.1f} on {name}"
                                                      for name, row, _ in general)])
    benches = [Path(b).parent.name for b in [*spec["cost"]["benches"].values(), *spec["cost"]["general"].values()]]
    commits = sorted({r["cost_commit"] for r in rows} | {b["commit"] for _, _, b in general})
    batches = sorted({r["batch"] for r in rows} | {b["setup"]["batch"] for _, _, b in general})
    index = sorted(r["index_pfe"] for r in rows)
    return (crossfit_table(loops) + "\n\n## Cost\n\n"
            "A ranker read here is a MaxSim over stored codes, not a forward.\n"
            "The loop's time per question is the Labeler's, the Filter's and the retriever's.\n"
            f"Per question, in plain MiniLM pair forwards, batched / one question at a time: {cost}.\n"
            f"A batch is {'/'.join(map(str, batches))} questions.\n"
            f"Benches `{'`, `'.join(benches)}` of `{Path(spec['cost']['report']).parent.as_posix()}/`, commit "
            f"{', '.join(commits)}, {_cores(rows)}.\n"
            f"A first opening of a corpus costs {index[0] / 1000:.1f}-{index[-1] / 1000:.1f} pair forwards a chunk "
            "more, once: mostly e5-small's encoding and the late ranker's vectors.\n"
            f"Index time: `{Path(spec['index']['report']).parent.as_posix()}/`, commit {rows[0]['index_commit']}.\n"
            "Generated from `reports/headline.json` by `python scripts/render_headline.py`.\n")


def quickstart_summary(spec: dict, root: str | Path) -> list[dict]:
    """The committed quickstart output's ``summary.json``: its table's figures."""
    return json.loads((Path(root) / spec["quickstart"]["evidence"]).read_text())


def quickstart_printed(summary: list[dict], caption: bool = True) -> str:
    """What ``effrag quickstart`` prints of ``summary`` (its ``summary.json``) on an 80-column terminal."""
    import io

    from rich.console import Console

    from effrag.quickstart import SHIPPED, comparison_table, terminal_table

    t = comparison_table(summary, SHIPPED)
    console = Console(width=80, file=io.StringIO(), record=True)
    console.print(terminal_table(t if caption else {**t, "caption": None}, 80))
    return console.export_text()


def quickstart_markdown(spec: dict, root: str | Path) -> str:
    """The README's copy of what the quickstart printed (its table, the caption left out), from its committed
    ``summary.json``, and where EfficientRAG trails there."""
    q = spec["quickstart"]
    summary = quickstart_summary(spec, root)
    trails = [spec["datasets"].get(s["dataset"], s["dataset"]) for s in summary
              if not all(s.get(f"bar{c}_met", True) for c in (7, 10))]
    verdict = (f"On these questions EfficientRAG trails the strongest Direct-R on {' and '.join(trails)}."
               if trails else "On these questions EfficientRAG meets the strongest Direct-R on every dataset.")
    return ("```\n" + quickstart_printed(summary, caption=False) + "```\n\n" + verdict + "\n"
            f"From `{q['evidence']}`, what `{q['command']}` wrote at commit {q['commit']}, {q['date']}. "
            "Generated from `reports/headline.json` by `python scripts/render_headline.py`.\n")


def inputs_digest(root: str | Path, paths: list[str]) -> str:
    """SHA-256 of what a run reads from ``paths`` (files, or folders walked in order): every file's bytes but
    Markdown and ``export.json``, and of a loop file only :data:`RUN_FIELDS`, so that a card or a rewritten figure
    leaves it as it was."""
    root, h = Path(root), hashlib.sha256()
    for top in paths:
        files = sorted(p for p in (root / top).rglob("*") if p.is_file()) if (root / top).is_dir() else [root / top]
        for f in files:
            if f.suffix == ".md" or f.name == "export.json":
                continue
            data = f.read_bytes()
            if f.name.startswith("loop") and f.suffix == ".json":
                loop = json.loads(data)
                data = json.dumps({k: loop.get(k) for k in RUN_FIELDS}, sort_keys=True).encode()
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def quickstart_inputs_stale(spec: dict, root: str | Path) -> str | None:
    """None when the shipped system and the sample are what the committed quickstart output ran with, else what to
    do: the output is stale, its figures are no expectation of the command."""
    q = spec["quickstart"]
    now = inputs_digest(root, q["inputs"])
    if now == q["inputs_sha256"]:
        return None
    return (f"{q['evidence']} is stale: the shipped system or the sample changed since it ran. Rerun "
            f"`{q['command']}`, copy its summary.json, comparison.md and printed table into "
            f"{Path(q['evidence']).parent.as_posix()}/ and set quickstart.inputs_sha256 in reports/headline.json "
            f"to {now}")


def rendered_blocks(spec: dict, root: str | Path) -> list[tuple[str, str, str]]:
    """Every rendered block: (file, marker name, block). The README's table and its copy of the quickstart's table;
    the card's figures and cost, and its dev figures (the recall report's ``table2.md`` and ``curve.md``)."""
    root = Path(root)
    report = (root / spec["recall"]["report"]).parent
    card = f"{spec['system']}/README.md"
    rows = headline_rows(spec, root)  # read once for both tables
    return [("README.md", "headline", headline_markdown(spec, root, rows)),
            ("README.md", "quickstart", quickstart_markdown(spec, root)),
            (card, "headline", card_markdown(spec, root, rows)),
            (card, "dev-figures", dev_figures_markdown((report / "table2.md").read_text(),
                                                       (report / "curve.md").read_text()))]


def render_targets(spec: dict, root: str | Path) -> dict[str, tuple[str, str]]:
    """Each file with rendered blocks: (its text now, its text rendered). A file is stale where they differ."""
    root, out = Path(root), {}
    for path, name, block in rendered_blocks(spec, root):
        now = out[path][0] if path in out else (root / path).read_text()
        out[path] = (now, replace_block(out[path][1] if path in out else now, block, name))
    return out
