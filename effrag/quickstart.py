"""``effrag quickstart``: EfficientRAG against the strongest plain retriever on the bundled sample, offline.

By default it evaluates the **shipped system** (:mod:`effrag.pretrained`, ``efficientrag-all``: the project's
recommended recipe, ``bash scripts/train_efficientrag.sh all``; its card says how it was made). The bundled dev
questions chose none of its loop configs' final picks (chosen on the other dev questions) and none of its weights
(trained on the train files); they are in the dev files on which the grid's fixed values, the loop structures and
the link design were settled (the caption says so). Stages (each cached under ``--workdir``; a rerun skips finished stages,
``--fresh`` starts over):

1. corpus  - pool the contexts of the bundled HotpotQA, 2WikiMultihopQA and MuSiQue sample (train + dev)
             into one deduplicated corpus;
2. index   - BM25, dense (all-MiniLM-L6-v2, FAISS) and their hybrid (RRF) over it; and dense and hybrid with the
             encoder the loop configs were tuned over where that is another (e5-small for the shipped system);
3. eval    - per dataset, on its bundled dev questions: Direct-R with each of these retrievers (k = 1..30),
             and EfficientRAG with the loop config tuned for that dataset (``loop-<dataset>.json``) over the
             retriever and encoder that config was tuned for, its ranked pool scored at 1..10 chunks;
4. report  - per dataset, EfficientRAG with at most 7 and 10 chunks against the strongest Direct-R at 20 and
             30, what the loop read per question, ``comparison.{json,md}`` and the recall-vs-chunks plot.

``--small`` is the minutes-long smoke run of the whole recipe instead: annotation-derived synthesis on the
sample's train files (``effrag synthesize``), a Labeler, a Filter and a pool ranker trained on it from MiniLM
(the CPU configs), then the same evaluation with a default loop config. Its models see 180 questions, so its
figures test the code path, not the method.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effrag.data.loaders import MULTIHOP_DATASETS
from effrag.pipelines.base import DEFAULT_RETRIEVER

DATASETS = MULTIHOP_DATASETS
KINDS = ("bm25", "dense", "hybrid")
ENCODED = ("dense", "hybrid")  # the kinds with a dense encoder
SHORT_ENCODER = {"e5-small": "e5"}  # a Direct-R row's retriever name: hybrid-e5 (the table stays 80 columns wide)
CURVE_MAX = 10        # EfficientRAG's pool is scored at 1..10 chunks
DIRECT_K_MAX = 30     # Direct-R at 1..30
BARS = {7: 20, 10: 30}  # at most this many chunks -> the Direct-R depth to reach
CAPTION = ("D-R = Direct-R, the best of BM25, dense and hybrid (with each encoder) at that depth; ER = EfficientRAG with at most 7 / "
           "10 chunks (margin in points); read/q = Labeler + ranker reads per question. These bundled dev "
           "questions chose none of the shipped loop configs' final picks (cost point, pool weights) and none of "
           "the weights; they are in the dev files on which the grid's fixed values (token and filter thresholds, "
           "labeler_top), the loop structures and the link design were settled, and the selection margin was set "
           "after a first look at the MuSiQue ones (effrag/pretrained/efficientrag-all/README.md). bf16 and fp32 "
           "kernels (CPU kinds) can move a cell by one passage, 1.3-1.7 points (docs/reliability.md).")
SHIPPED = "shipped system efficientrag-all"  # what the table's title names as the system it ran
# --small: the loop config of the smoke models (the shipped system brings its tuned ones)
SMALL_CONFIG = {"first_hop_k": 20, "hop_k": 5, "max_hops": 2, "tag_threshold": 0.5, "token_threshold": 0.3,
                "filter_threshold": 0.3, "query_chunks": 1, "pool_source": "seen", "pool_order": "rank",
                "retrieval_weight": 0.5, "labeler_top": 3, "max_candidates": CURVE_MAX}


def add_quickstart_parser(sub) -> None:
    p = sub.add_parser("quickstart", help="EfficientRAG (the shipped system) vs Direct-R on the bundled sample")
    p.add_argument("--workdir", default="runs/quickstart", help="where every stage writes (cached)")
    p.add_argument("--retriever", choices=KINDS, default=None,
                   help="EfficientRAG's retriever (default: the one its loop config was tuned for); Direct-R "
                        "runs with every retriever")
    p.add_argument("--small", action="store_true",
                   help="smoke run: synthesize from the sample and train tiny models instead of the shipped system")
    p.add_argument("--epochs", type=float, default=2.0, help="--small: training epochs of each model")
    p.add_argument("--max-train-examples", type=int, default=None, help="--small: cap on training records per model")
    p.add_argument("--limit", type=int, default=None, help="dev questions per dataset (default: all 30)")
    p.add_argument("--llm", default=None, metavar="SPEC",
                   help="also answer with this LLM (e.g. 'default' = bundled SmolLM2) and report EM/F1")
    p.add_argument("--fresh", action="store_true", help="delete the workdir first")
    p.set_defaults(func=_cmd_quickstart)


def _cmd_quickstart(args) -> None:
    run_quickstart(workdir=args.workdir, retriever=args.retriever, small=args.small, epochs=args.epochs,
                   max_train_examples=args.max_train_examples, limit=args.limit, llm=args.llm, fresh=args.fresh)


class _Stages:
    """Runs named stages once: a stage is done when its marker holds the same settings hash."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.console = _console()

    def run(self, name: str, settings: dict[str, Any], fn: Callable[[], Any]) -> Any:
        marker = self.workdir / f".{name}.done"
        from effrag.state_files import read_json, write_text_atomic

        digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
        done = read_json(marker, "remove it to run that stage again") if marker.is_file() else None
        if isinstance(done, dict) and done.get("settings") == digest:
            self.console.print(f"[green]✓[/green] {name}: cached ({marker})")
            return done.get("result")
        self.console.rule(f"[bold]{name}")
        t0 = time.time()
        result = fn()
        write_text_atomic(marker, json.dumps({"settings": digest, "result": result, "seconds": time.time() - t0}))
        self.console.print(f"[green]✓[/green] {name}: {time.time() - t0:.1f}s")
        return result


def _console():
    from rich.console import Console

    return Console()


def run_quickstart(workdir: str | Path = "runs/quickstart", retriever: str | None = None, small: bool = False,
                   epochs: float = 2.0, max_train_examples: int | None = None, limit: int | None = None,
                   llm: str | None = None, fresh: bool = False,
                   datasets: tuple[str, ...] = DATASETS) -> list[dict[str, Any]]:
    """Run every stage; returns the metric rows (also in ``<workdir>/comparison.json``).

    Rows: Direct-R (``method`` ``direct-r/<retriever>``) at k = 1..30 and EfficientRAG's pool cut at 1..10
    chunks (``method`` ``efficientrag``, ``k`` = the cut, ``forwards`` = what the loop read per question), per
    dataset; ``<workdir>/summary.json`` holds the table.
    """
    from effrag.data import sample_path
    from effrag.setup import RunSetup

    wd = Path(workdir)
    if fresh and wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True, exist_ok=True)
    stages = _Stages(wd)
    train_files = [str(sample_path(ds, "train")) for ds in datasets]
    dev_files = [str(sample_path(ds, "dev")) for ds in datasets]
    corpus_path = wd / "corpus.jsonl"

    def corpus_stage():
        corpus = RunSetup.build(corpus_from=train_files + dev_files, retriever=None).corpus
        corpus.save(corpus_path)
        return {"passages": len(corpus)}

    stages.run("corpus", {"files": train_files + dev_files}, corpus_stage)
    pooled = RunSetup.build(corpus=corpus_path, retriever=None)  # the corpus; its retrievers, cached
    setups = {kind: pooled.over(kind, cache_dir=wd / "index", bf16=kind != "bm25") for kind in KINDS}
    if small:
        system = _train_small(stages, wd, pooled.corpus, train_files, dev_files, epochs, max_train_examples)
    else:
        system = None
    identity = _system_identity(system)
    files_of = {ds: _system_files(system, ds) for ds in datasets}
    # the encoder the loop configs were tuned over, where not MiniLM: its dense and hybrid too, which Direct-R runs
    # with as well, so that the bar is the strongest plain retriever with either encoder (none when the loop runs
    # over BM25: --retriever bm25 is the quick look)
    for enc in sorted({f["encoder"] for f in files_of.values()} - {None, "minilm"}):
        if retriever in (None, *ENCODED):
            for kind in ENCODED:
                setups[searcher_name(kind, enc)] = pooled.over(kind, cache_dir=wd / "index", bf16=True, encoder=enc)
    rows = []
    for ds, dev in zip(datasets, dev_files):
        files = files_of[ds]
        kind = retriever or files["retriever"] or DEFAULT_RETRIEVER
        name = searcher_name(kind, files["encoder"])
        setup = setups[name].ask(dev, limit=limit)
        settings = {**setup.identity(), "limit": limit, "llm": llm, "models": identity, "loop": files["config_text"],
                    "curve": CURVE_MAX, "direct": DIRECT_K_MAX}
        # one folder per settings: a killed evaluation resumes, a changed one never reuses old predictions
        out = wd / "eval" / f"{ds}-{hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]}"
        rows += stages.run(f"eval-{ds}", settings,
                           lambda ds=ds, setup=setup, files=files, out=out, name=name: _evaluate(
                               ds, setup, setups, files, out, llm, name))
    summary = summarize(rows)
    _report(rows, summary, wd, stages.console, "--small smoke models" if small else SHIPPED)
    return rows


def searcher_name(kind: str, encoder: str | None) -> str:
    """A retriever's name in the comparison: its kind, and the encoder where it has one other than MiniLM."""
    if kind not in ENCODED or encoder in (None, "minilm"):
        return kind
    return f"{kind}-{SHORT_ENCODER.get(encoder, encoder)}"


def _system_files(system: dict | None, dataset: str) -> dict[str, Any]:
    """The models and loop config EfficientRAG runs with on ``dataset``: the shipped system's, or --small's."""
    if system is not None:
        return {**system, "encoder": None, "config_text": json.dumps(SMALL_CONFIG, sort_keys=True)}
    from effrag.pipelines import get_pipeline_class

    plan = get_pipeline_class("efficientrag").plan({"model": "efficientrag-all"}, dataset=dataset)  # as every door
    return {"model": "efficientrag-all", "config": plan.settings, "retriever": plan.retriever, "encoder": plan.encoder,
            "config_text": Path(plan.settings).read_text() if plan.settings else None}


def _system_identity(system: dict | None) -> dict[str, str]:
    """Changes whenever a checkpoint's weights do (its config records their sha256)."""
    if system is None:
        from effrag.pipelines.efficientrag.system import open_system

        files = open_system("efficientrag-all")
        paths = {"labeler": files.labeler, "filter": files.filter, "ranker": files.ranker}
    else:
        paths = {k: system[k] for k in ("labeler", "filter", "ranker")}
    from effrag.models.model_files import CONFIG_NAME

    return {k: hashlib.sha1((Path(p) / CONFIG_NAME).read_bytes()).hexdigest()
            for k, p in paths.items() if p is not None}


def _train_small(stages, wd: Path, corpus, train_files, dev_files, epochs, max_train_examples) -> dict:
    """The --small path: ``effrag synthesize`` and ``effrag ranker-data`` on the sample, then three trainings."""
    synth_dir, groups_dir = wd / "synth", wd / "ranker-data"

    def synth_stage():
        from effrag.cli import main as effrag_main

        shutil.rmtree(synth_dir, ignore_errors=True)
        summary = {}
        for split, files in (("train", train_files), ("dev", dev_files)):
            argv = ["synthesize", "--inputs", *files, "--output", str(synth_dir / split), "--source", "annotation",
                    "--retriever", "bm25", "--corpus-from", *train_files, *dev_files, "--quiet"]
            if effrag_main(argv) != 0:
                raise RuntimeError(f"effrag {' '.join(argv)} failed (message above)")
            summary[split] = json.loads((synth_dir / split / "stats.json").read_text())
            argv = ["ranker-data", "--synth", str(synth_dir / split), "--inputs", *files,
                    "--output", str(groups_dir / split), "--retriever", "bm25", "--groups-per-positive", "1",
                    "--cache-dir", str(wd / "index"), "--quiet"]
            if effrag_main(argv) != 0:
                raise RuntimeError(f"effrag {' '.join(argv)} failed (message above)")
        return summary

    stages.run("synth", {"files": train_files + dev_files, "corpus": corpus.fingerprint()}, synth_stage)
    system: dict[str, Any] = {"config": None, "retriever": "hybrid"}
    for task, data in (("labeler", synth_dir), ("filter", synth_dir), ("ranker", groups_dir)):
        out = wd / "models" / task
        settings = {"task": task, "epochs": epochs, "max": max_train_examples, "data": str(data)}
        stages.run(f"train-{task}", settings,
                   lambda task=task, out=out, data=data: _train(task, data, out, epochs, max_train_examples))
        system[task] = out / "last"
    return system


def _train(task: str, data: Path, out: Path, epochs: float, max_examples: int | None) -> dict:
    from effrag import configs
    from effrag.training import load_config, train

    shutil.rmtree(out, ignore_errors=True)
    # the packaged CPU config of the task (configs/<task>.yaml) on the sample's data
    cfg = load_config(configs.path(task), {
        "data": {"train_file": str(data / "train" / f"{task}.jsonl"),
                 "eval_files": [str(data / "dev" / f"{task}.jsonl")], "max_train_examples": max_examples,
                 "max_eval_examples": None},
        "train": {"output_dir": str(out), "epochs": epochs, "save_every": 0, "torch_threads": None},
    })
    results = train(cfg)
    return {k: v for k, v in results.items() if isinstance(v, (int, float, str, dict))}


def _evaluate(ds: str, setup, setups: dict, files: dict, out: Path, llm: str | None, kind: str) -> list[dict]:
    """Direct-R with each retriever at k = 1..30, EfficientRAG's pool (capped at 10) cut at 1..10 chunks, on
    ``setup``'s questions (over EfficientRAG's retriever, ``setups[kind]``; ``setups`` holds the same corpus under
    each retriever)."""
    from effrag.evaluation import evaluate
    from effrag.pipelines import build_pipeline, get_pipeline_class

    # per-batch "inputs truncated at max_length" notes would drown the progress bars (the figures count them in)
    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    questions, gold = setup.questions, setup.gold
    searchers = {name: s.retriever for name, s in setups.items()}
    generator = None
    if llm:
        from effrag.pipelines.generation import Generator

        generator = Generator(llm, dataset=ds)
    rows = []
    for name, search in searchers.items():  # answers are read at one k only
        direct = build_pipeline("direct-r", search, k=DIRECT_K_MAX, generator=generator)
        ks = [DIRECT_K_MAX] if generator is not None else list(range(1, DIRECT_K_MAX + 1))
        rows += [{**r, "method": f"direct-r/{name}"} for r in evaluate(
            direct, questions, gold, out / f"direct-r-{name}", {"method": "direct-r", "dataset": ds, "retriever": name},
            ks=ks, show_progress=True)]
    if "model" in files:
        plan = get_pipeline_class("efficientrag").plan({"model": files["model"], "er_config": files["config"],
                                                        "max_candidates": CURVE_MAX, "bf16": True}, dataset=ds)
        erag = plan.build(searchers[kind], generator=generator)
    else:
        erag = build_pipeline("efficientrag", searchers[kind], labeler=str(files["labeler"]),
                              filter=str(files["filter"]), ranker=str(files["ranker"]), config=SMALL_CONFIG,
                              generator=generator, bf16=True)
    (entry,) = evaluate(erag, questions, gold, out / "efficientrag",
                        {"method": "efficientrag", "dataset": ds, "retriever": kind}, batch_size=8, show_progress=True)
    return rows + _pool_curve(entry, out / "efficientrag" / "predictions.jsonl", kind)


def _pool_curve(entry: dict, predictions: Path, kind: str) -> list[dict]:
    """EfficientRAG's ranked pool cut at 1..CURVE_MAX chunks (the loop with ``max_candidates = c``), with what
    the loop read per question."""
    from effrag.evaluation import read_predictions
    from effrag.evaluation.runner import aggregate
    from effrag.tuning import forwards

    preds = read_predictions(predictions)
    read = [forwards(p.result.hops) for p in preds]
    cost = [sum(r[j] for r in read) / len(read) for j in range(3)]
    rows = [p.to_row() for p in preds]
    return [{**aggregate(rows, c, entry["method"], entry["dataset"], cut_at_k=True), "retriever": kind,
             "forwards": cost} for c in range(1, CURVE_MAX + 1)]


def summarize(rows: list[dict]) -> list[dict]:
    """Per dataset: EfficientRAG with at most 7 and 10 chunks against the strongest Direct-R at 20 and 30."""
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        at = {(r["method"], r["k"]): r for r in rows if r["dataset"] == ds}
        item: dict[str, Any] = {"dataset": ds}
        er = {c: at.get(("efficientrag", c)) for c in BARS}
        for chunks, depth in BARS.items():
            kind, best = max(((m.split("/", 1)[1], r) for (m, k), r in at.items()
                              if m.startswith("direct-r/") and k == depth), key=lambda x: x[1]["recall"])
            item[f"direct_r@{depth}"], item[f"direct_r@{depth}_retriever"] = best["recall"], kind
            mine = er[chunks]
            item[f"efficientrag@{chunks}"] = mine and mine["recall"]
            item[f"efficientrag@{chunks}_chunks"] = mine and mine["avg_chunks"]
            if mine:
                item[f"bar{chunks}_margin"] = mine["recall"] - best["recall"]
                item[f"bar{chunks}_met"] = mine["recall"] >= best["recall"]
            item["n"] = best["n"]
        last = er[max(BARS)]
        if last:
            item["forwards"] = last.get("forwards")
            item["latency_s"] = last["latency_s"]
            item["retriever"] = last.get("retriever")
            for key in ("em", "f1"):
                if key in last:
                    item[f"efficientrag_{key}"] = last[key]
        out.append(item)
    return out


def comparison_table(summary: list[dict], what: str) -> dict[str, Any]:
    """The comparison as ``comparison.md`` has it (``title``, ``caption``, ``columns``, ``rows``: every column) and as
    the terminal shows it (``short_title``, ``short_columns``, ``short_rows``: fits 80 columns, the questions per
    dataset in the title)."""
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    body = []
    for s in summary:
        cells = [s["dataset"], str(s["n"])]
        for chunks, depth in BARS.items():
            cells.append(f"{pct(s[f'direct_r@{depth}'])} {s[f'direct_r@{depth}_retriever']}")
            margin = s.get(f"bar{chunks}_margin")
            cells.append(f"{pct(s[f'efficientrag@{chunks}'])} {100 * margin:+.1f}" if margin is not None else "-")
        f = s.get("forwards")
        cells.append(f"{f[0]:.0f}+{f[1]:.0f}" if f else "-")
        body.append(cells)
    kind = next((s.get("retriever") for s in summary if s.get("retriever")), "?")
    title = f"EfficientRAG ({what}, over {kind}) vs the strongest Direct-R: recall %"
    sizes = "/".join(dict.fromkeys(str(s["n"]) for s in summary))
    return {"title": title, "caption": CAPTION, "rows": body, "short_rows": [[r[0], *r[2:]] for r in body],
            "columns": ["dataset", "questions", "strongest Direct-R@20 (retriever)",
                        "EfficientRAG <= 7 chunks (vs Direct-R@20)", "strongest Direct-R@30 (retriever)",
                        "EfficientRAG <= 10 chunks (vs Direct-R@30)", "pairs read per question (Labeler + ranker)"],
            "short_columns": ["dataset", "D-R@20", "ER<=7", "D-R@30", "ER<=10", "read/q"],
            "short_title": f"{title}; {sizes} questions per dataset"}


def terminal_table(t: dict[str, Any], width: int = 80):
    """The rich table the quickstart prints (:func:`comparison_table`'s short form), at most ``width`` columns."""
    from rich.table import Table

    table = Table(title=t["short_title"], caption=t["caption"], width=min(width, 80))
    for c in t["short_columns"]:
        table.add_column(c, justify="left" if c == "dataset" else "right", no_wrap=True)
    for cells in t["short_rows"]:
        table.add_row(*cells)
    return table


def comparison_markdown(t: dict[str, Any]) -> str:
    """``comparison.md``: :func:`comparison_table`'s title, caption and every column."""
    from effrag.evaluation.report import md_table

    return f"# {t['title']}\n\n{t['caption']}\n\n" + md_table(t["columns"], t["rows"])


def _report(rows: list[dict], summary: list[dict], wd: Path, console, what: str) -> None:
    t = comparison_table(summary, what)
    table = terminal_table(t, console.width)
    console.print(table)
    from effrag.state_files import write_text_atomic

    write_text_atomic(wd / "comparison.json", json.dumps(rows, indent=2))
    write_text_atomic(wd / "summary.json", json.dumps(summary, indent=2))
    write_text_atomic(wd / "comparison.md", comparison_markdown(t))
    console.print(f"written: {wd / 'comparison.md'}")
    try:
        from effrag.evaluation.plots import write_report_plot

        plot_rows = [r for r in rows if r["method"] == "efficientrag" or r["method"].startswith("direct-r/")]
        paths = write_report_plot(plot_rows, wd, title="Recall vs chunks on the bundled dev questions")
        console.print(f"written: {paths['png']}")
    except ImportError:
        console.print("recall-vs-chunks plot skipped: pip install 'effrag[plots]' (matplotlib)")
