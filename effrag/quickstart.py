"""``effrag quickstart``: EfficientRAG against plain dense retrieval on the bundled sample, offline.

By default it evaluates the **shipped model** (:mod:`effrag.pretrained`, ``efficientrag-all``: the
project's recommended recipe, ``bash scripts/train_efficientrag.sh all``, trained on the three
datasets' train files pooled; its card says how). Training that recipe takes about 7 minutes on one
GPU and far more than the quickstart's budget on 2 CPU cores, so the quickstart ships its result
instead of a smaller model that would not show what the method does. Stages (each cached under
``--workdir``; a rerun skips finished stages, ``--fresh`` starts over):

1. corpus  - pool the contexts of the bundled HotpotQA, 2WikiMultihopQA and MuSiQue sample
             (train + dev) into one deduplicated corpus;
2. index   - a dense FAISS index over it with all-MiniLM-L6-v2 (or BM25);
3. eval    - per dataset, on its bundled dev questions: Direct-R (k = 1..20) and EfficientRAG with the
             loop config tuned on that dataset's dev file, its ranked pool scored at 1..10 chunks;
4. report  - the table (with, per dataset, whether EfficientRAG reaches Direct-R@20's recall with at
             most 10 chunks), ``comparison.{json,md}`` and the recall-vs-chunks plot.

``--small`` is the minutes-long smoke run of the whole recipe instead: annotation-derived synthesis on
the sample's train files (``effrag synthesize``), a Labeler and a Filter trained on it from MiniLM (the
CPU configs), then the same evaluation. Its models see 180 questions, so its figures test the code
path, not the method.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

DATASETS = ("hotpotqa", "2wikimqa", "musique")


CURVE_MAX = 10  # the chunk budget of the bar: EfficientRAG with at most 10 chunks ...
BAR_K = 20      # ... against Direct-R@20


def add_quickstart_parser(sub) -> None:
    p = sub.add_parser("quickstart", help="EfficientRAG (the shipped model) vs Direct-R on the bundled sample")
    p.add_argument("--workdir", default="runs/quickstart", help="where every stage writes (cached)")
    p.add_argument("--retriever", choices=["dense", "bm25"], default="dense")
    p.add_argument("--small", action="store_true",
                   help="smoke run: synthesize from the sample and train tiny models instead of the shipped model")
    p.add_argument("--epochs", type=float, default=2.0, help="--small: training epochs for the Labeler and the Filter")
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
        digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
        if marker.is_file() and json.loads(marker.read_text()).get("settings") == digest:
            self.console.print(f"[green]✓[/green] {name}: cached ({marker})")
            return json.loads(marker.read_text()).get("result")
        self.console.rule(f"[bold]{name}")
        t0 = time.time()
        result = fn()
        marker.write_text(json.dumps({"settings": digest, "result": result, "seconds": time.time() - t0}))
        self.console.print(f"[green]✓[/green] {name}: {time.time() - t0:.1f}s")
        return result


def _console():
    from rich.console import Console

    return Console()


def run_quickstart(workdir: str | Path = "runs/quickstart", retriever: str = "dense", small: bool = False,
                   epochs: float = 2.0, max_train_examples: int | None = None, limit: int | None = None,
                   llm: str | None = None, fresh: bool = False,
                   datasets: tuple[str, ...] = DATASETS) -> list[dict[str, Any]]:
    """Run every stage; returns the metric rows (also in ``<workdir>/comparison.json``).

    Rows: Direct-R at k = 1..20 and EfficientRAG's pool cut at 1..10 chunks (``method``
    ``efficientrag``, ``k`` = the cut), per dataset; ``<workdir>/summary.json`` holds the table.
    """
    from effrag.data import Corpus, sample_path
    from effrag.experiment import open_corpus

    wd = Path(workdir)
    if fresh and wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True, exist_ok=True)
    stages = _Stages(wd)
    train_files = [str(sample_path(ds, "train")) for ds in datasets]
    dev_files = [str(sample_path(ds, "dev")) for ds in datasets]
    corpus_path = wd / "corpus.jsonl"

    def corpus_stage():
        corpus = open_corpus(corpus_from=train_files + dev_files)
        corpus.save(corpus_path)
        return {"passages": len(corpus)}

    stages.run("corpus", {"files": train_files + dev_files}, corpus_stage)
    corpus = Corpus.from_jsonl(corpus_path)
    search = _retriever(retriever, corpus, wd / "index")
    if small:
        models, loop_configs = _train_small(stages, wd, retriever, corpus, train_files, dev_files, epochs,
                                            max_train_examples)
    else:
        models, loop_configs = _shipped(datasets)
    identity = {task: _model_identity(path) for task, path in models.items()}
    rows = []
    for ds, dev in zip(datasets, dev_files):
        cfg = loop_configs.get(ds)
        settings = {"dev": dev, "retriever": retriever, "limit": limit, "llm": llm, "models": identity,
                    "loop": cfg and Path(cfg).read_text(), "corpus": corpus.fingerprint(), "curve": CURVE_MAX}
        # one folder per settings: a killed evaluation resumes, a changed one never reuses old predictions
        out = wd / "eval" / f"{ds}-{hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]}"
        rows += stages.run(f"eval-{ds}", settings,
                           lambda ds=ds, dev=dev, cfg=cfg, out=out: _evaluate(ds, dev, corpus, search, models, cfg,
                                                                              out, limit, llm))
    summary = summarize(rows, {ds: _config_cap(loop_configs.get(ds)) for ds in datasets})
    _report(rows, summary, wd, stages.console, "--small smoke models" if small else "shipped model efficientrag-all")
    return rows


def _shipped(datasets) -> tuple[dict[str, Path], dict[str, Path]]:
    from effrag.pretrained import loop_config_path, pretrained_path

    d = pretrained_path("efficientrag-all")
    return {"labeler": d / "labeler", "filter": d / "filter"}, {ds: loop_config_path(ds) for ds in datasets}


def _train_small(stages, wd: Path, retriever: str, corpus, train_files, dev_files, epochs, max_train_examples):
    """The --small path: ``effrag synthesize`` on the sample (negatives mined from the index), then training."""
    synth_dir = wd / "synth"

    def synth_stage():
        from effrag.cli import main as effrag_main

        shutil.rmtree(synth_dir, ignore_errors=True)
        summary = {}
        for split, files in (("train", train_files), ("dev", dev_files)):
            argv = ["synthesize", "--inputs", *files, "--output", str(synth_dir / split), "--source", "annotation",
                    "--retriever", retriever, "--corpus-from", *train_files, *dev_files,
                    "--cache-dir", str(wd / "index"), *(["--bf16"] if retriever == "dense" else [])]
            if effrag_main(argv) != 0:
                raise RuntimeError(f"effrag {' '.join(argv)} failed (message above)")
            summary[split] = json.loads((synth_dir / split / "stats.json").read_text())
        return summary

    stages.run("synth", {"files": train_files + dev_files, "retriever": retriever, "corpus": corpus.fingerprint()},
               synth_stage)
    models = {}
    for task in ("labeler", "filter"):
        out = wd / "models" / task
        settings = {"task": task, "epochs": epochs, "max": max_train_examples, "synth": str(synth_dir)}
        stages.run(f"train-{task}", settings,
                   lambda task=task, out=out: _train(task, synth_dir, out, epochs, max_train_examples))
        models[task] = out / "best"
    return models, {}


def _model_identity(path: Path) -> str:
    """Changes whenever the checkpoint's weights do (its config records their sha256)."""
    return hashlib.sha1((Path(path) / "effrag_config.json").read_bytes()).hexdigest()


def _config_cap(path) -> int | None:
    if path is None:
        return None
    return json.loads(Path(path).read_text()).get("config", {}).get("max_candidates")


def _retriever(kind: str, corpus, cache_root: Path):
    from effrag.experiment import open_retriever

    return open_retriever(kind, corpus, cache_dir=cache_root, bf16=kind == "dense")


def _train(task: str, synth_dir: Path, out: Path, epochs: float, max_examples: int | None) -> dict:
    from effrag import configs
    from effrag.training import load_config, train

    shutil.rmtree(out, ignore_errors=True)
    # the packaged CPU config of the task (configs/labeler.yaml, configs/filter.yaml) on the sample's data
    cfg = load_config(configs.path(task), {
        "data": {"train_file": str(synth_dir / "train" / f"{task}.jsonl"),
                 "eval_files": [str(synth_dir / "dev" / f"{task}.jsonl")], "max_train_examples": max_examples,
                 "max_eval_examples": None},
        "train": {"output_dir": str(out), "epochs": epochs, "save_every": 0, "torch_threads": None},
    })
    results = train(cfg)
    return {k: v for k, v in results.items() if isinstance(v, (int, float, str, dict))}


def _evaluate(ds: str, dev: str, corpus, search, models: dict, loop_config, out: Path, limit: int | None,
              llm: str | None) -> list[dict]:
    """Direct-R at k = 1..20 and EfficientRAG's pool (capped at 10) cut at 1..10 chunks."""
    from effrag.evaluation import evaluate
    from effrag.experiment import RunSetup
    from effrag.pipelines import build_pipeline

    # per-batch "inputs truncated at max_length" notes would drown the progress bars (the figures count them in)
    logging.getLogger("effrag.models").setLevel(logging.ERROR)
    setup = RunSetup.build(dev, limit=limit, corpus=corpus, retriever=search)
    questions, gold = setup.questions, setup.gold
    generator = None
    if llm:
        from effrag.pipelines.generation import Generator

        generator = Generator(llm, dataset=ds)
    direct = build_pipeline("direct-r", search, k=BAR_K, generator=generator)
    ks = [BAR_K] if generator is not None else list(range(1, BAR_K + 1))  # answers are read at one k only
    rows = evaluate(direct, questions, gold, out / "direct-r", {"method": "direct-r", "dataset": ds}, ks=ks,
                    show_progress=True)
    erag = build_pipeline("efficientrag", search, labeler=str(models["labeler"]), filter=str(models["filter"]),
                          er_config=str(loop_config) if loop_config else None, max_candidates=CURVE_MAX,
                          generator=generator, bf16=True)
    (entry,) = evaluate(erag, questions, gold, out / "efficientrag", {"method": "efficientrag", "dataset": ds},
                        batch_size=8, show_progress=True)
    return rows + _pool_curve(entry, out / "efficientrag" / "predictions.jsonl")


def _pool_curve(entry: dict, predictions: Path) -> list[dict]:
    """EfficientRAG's ranked pool cut at 1..CURVE_MAX chunks: the loop with ``max_candidates = c``."""
    from effrag.evaluation.runner import aggregate
    from effrag.jsonl import read_jsonl

    preds = list(read_jsonl(predictions))
    return [aggregate(preds, c, entry["method"], entry["dataset"], cut_at_k=True) for c in range(1, CURVE_MAX + 1)]


def summarize(rows: list[dict], caps: dict[str, int | None]) -> list[dict]:
    """Per dataset: Direct-R@10/@20, EfficientRAG at its loop config's cap and at 10 chunks, and the bar
    (EfficientRAG's recall with at most 10 chunks >= Direct-R@20's)."""
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        at = {(r["method"], r["k"]): r for r in rows if r["dataset"] == ds}
        er10, dr20 = at.get(("efficientrag", CURVE_MAX)), at.get(("direct-r", BAR_K))
        cap = caps.get(ds) or CURVE_MAX
        er_cap = at.get(("efficientrag", min(cap, CURVE_MAX)))
        item = {"dataset": ds, "n": dr20["n"] if dr20 else None,
                "direct_r@10": at.get(("direct-r", 10), {}).get("recall"), f"direct_r@{BAR_K}": dr20 and dr20["recall"],
                "efficientrag_cap": min(cap, CURVE_MAX), "efficientrag@cap": er_cap and er_cap["recall"],
                "efficientrag@cap_chunks": er_cap and er_cap["avg_chunks"],
                f"efficientrag@{CURVE_MAX}": er10 and er10["recall"],
                f"efficientrag@{CURVE_MAX}_chunks": er10 and er10["avg_chunks"],
                "latency_s": er10 and er10["latency_s"], "direct_r_latency_s": dr20 and dr20["latency_s"]}
        if er10 and dr20:
            best = max(r["recall"] for (m, _), r in at.items() if m == "efficientrag")
            item["bar_met"] = best >= dr20["recall"]
            item["bar_margin"] = best - dr20["recall"]
        for key in ("em", "f1"):
            if er10 and key in er10:
                item[f"efficientrag_{key}"], item[f"direct_r@{BAR_K}_{key}"] = er10[key], dr20 and dr20.get(key)
        out.append(item)
    return out


def _report(rows: list[dict], summary: list[dict], wd: Path, console, what: str) -> None:
    from rich.table import Table

    from effrag.evaluation.report import md_table

    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    cols = ["dataset", "n", "Direct-R@10", f"Direct-R@{BAR_K}", "EfficientRAG (loop config) recall / chunks",
            f"EfficientRAG <= {CURVE_MAX} chunks recall / chunks", f">= Direct-R@{BAR_K} with <= {CURVE_MAX} chunks",
            "latency s/q (EfficientRAG / Direct-R)"]
    short = ["dataset", "n", "D-R@10", f"D-R@{BAR_K}", "ER config", f"ER <={CURVE_MAX}", "bar", "s/q ER/D-R"]
    body = []
    for s in summary:
        bar = "-" if "bar_met" not in s else f"{'yes' if s['bar_met'] else 'NO'} ({100 * s['bar_margin']:+.1f})"
        body.append([s["dataset"], str(s["n"]), pct(s["direct_r@10"]), pct(s[f"direct_r@{BAR_K}"]),
                     f"{pct(s['efficientrag@cap'])}/{_fmt(s['efficientrag@cap_chunks'])}",
                     f"{pct(s[f'efficientrag@{CURVE_MAX}'])}/{_fmt(s[f'efficientrag@{CURVE_MAX}_chunks'])}", bar,
                     f"{s['latency_s']:.2f}/{s['direct_r_latency_s']:.2f}" if s["latency_s"] is not None else "-"])
    title = f"EfficientRAG ({what}) vs Direct-R, dense MiniLM retriever, bundled dev questions: recall %"
    table = Table(title=title, caption=f"D-R = Direct-R; ER = EfficientRAG recall / chunks with its loop config and "
                                       f"cut at {CURVE_MAX}; bar = EfficientRAG reaches Direct-R@{BAR_K}'s recall "
                                       f"with <= {CURVE_MAX} chunks (margin in points)")
    for c in short:
        table.add_column(c, justify="left" if c == "dataset" else "right")
    for cells in body:
        table.add_row(*cells)
    console.print(table)
    (wd / "comparison.json").write_text(json.dumps(rows, indent=2))
    (wd / "summary.json").write_text(json.dumps(summary, indent=2))
    (wd / "comparison.md").write_text(f"# {title}\n\n" + md_table(cols, body))
    console.print(f"written: {wd / 'comparison.md'}")
    try:
        from effrag.evaluation.plots import write_report_plot

        paths = write_report_plot(rows, wd, title="Recall vs chunks on the bundled dev questions")
        console.print(f"written: {paths['png']}")
    except ImportError:
        console.print("recall-vs-chunks plot skipped: pip install 'effrag[plots]' (matplotlib)")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 1 else f"{v:.1f}".removesuffix(".0")
    return str(v)
