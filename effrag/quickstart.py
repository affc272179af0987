"""``effrag quickstart``: the whole EfficientRAG recipe on the bundled sample, offline.

Stages (each cached under ``--workdir``; a rerun skips finished stages, and
``--fresh`` starts over):

1. corpus  - pool the contexts of the bundled HotpotQA, 2WikiMultihopQA and MuSiQue
             sample (train + dev) into one deduplicated corpus;
2. index   - a dense FAISS index over it with all-MiniLM-L6-v2 (or BM25);
3. synth   - ``effrag synthesize``: annotation-derived training data (no LLM) from the
             sample's train files, hard negatives mined with that index;
4. train   - Labeler and Filter fine-tuned from MiniLM on it (the CPU configs);
5. eval    - EfficientRAG and Direct-R@10/20 on each dataset's sample dev questions,
             printed side by side (recall, chunks, latency).

The sample is small (60 train / 30 dev questions per dataset), so the figures are
a smoke test of the recipe, not the paper's numbers: ``scripts/`` reproduces
those on the full data in ``../shared/data``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

DATASETS = ("hotpotqa", "2wikimqa", "musique")


def add_quickstart_parser(sub) -> None:
    p = sub.add_parser("quickstart", help="corpus, index, synthesis, training and evaluation on the bundled sample")
    p.add_argument("--workdir", default="runs/quickstart", help="where every stage writes (cached)")
    p.add_argument("--retriever", choices=["dense", "bm25"], default="dense")
    p.add_argument("--epochs", type=float, default=2.0, help="training epochs for the Labeler and the Filter")
    p.add_argument("--max-train-examples", type=int, default=None, help="cap on training records per model")
    p.add_argument("--limit", type=int, default=None, help="dev questions per dataset (default: all 30)")
    p.add_argument("--llm", default=None, metavar="SPEC",
                   help="also answer with this LLM (e.g. 'default' = bundled SmolLM2) and report EM/F1")
    p.add_argument("--fresh", action="store_true", help="delete the workdir first")
    p.set_defaults(func=_cmd_quickstart)


def _cmd_quickstart(args) -> None:
    run_quickstart(workdir=args.workdir, retriever=args.retriever, epochs=args.epochs,
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


def run_quickstart(workdir: str | Path = "runs/quickstart", retriever: str = "dense", epochs: float = 2.0,
                   max_train_examples: int | None = None, limit: int | None = None, llm: str | None = None,
                   fresh: bool = False, datasets: tuple[str, ...] = DATASETS) -> list[dict[str, Any]]:
    """Run every stage; returns the comparison rows (also in ``<workdir>/comparison.{json,md}``)."""
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

    synth_dir = wd / "synth"

    def synth_stage():  # `effrag synthesize`, as a user runs it, negatives mined from the index built above
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

    rows = []
    for ds, dev in zip(datasets, dev_files):
        rows += stages.run(f"eval-{ds}", {"dev": dev, "retriever": retriever, "limit": limit, "llm": llm,
                                          "models": [str(m) for m in models.values()], "corpus": corpus.fingerprint()},
                           lambda ds=ds, dev=dev: _evaluate(ds, dev, corpus, search, models, wd / "eval" / ds,
                                                            limit, llm))
    _print_table(rows, wd, stages.console)
    return rows


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


def _evaluate(ds: str, dev: str, corpus, search, models: dict, out: Path, limit: int | None,
              llm: str | None) -> list[dict]:
    from effrag.evaluation import evaluate
    from effrag.experiment import RunSetup
    from effrag.pipelines import build_pipeline

    setup = RunSetup.build(dev, limit=limit, corpus=corpus, retriever=search)
    questions, gold = setup.questions, setup.gold
    generator = None
    if llm:
        from effrag.pipelines.generation import Generator

        generator = Generator(llm, dataset=ds)
    rows = []
    direct = build_pipeline("direct-r", search, k=20, generator=generator)
    ks = [10, 20] if generator is None else [20]
    rows += evaluate(direct, questions, gold, out / "direct-r", {"method": "direct-r", "dataset": ds}, ks=ks,
                     show_progress=True)
    erag = build_pipeline("efficientrag", search, labeler=str(models["labeler"]), filter=str(models["filter"]),
                          generator=generator, bf16=True)
    rows += evaluate(erag, questions, gold, out / "efficientrag", {"method": "efficientrag", "dataset": ds},
                     batch_size=8, show_progress=True)
    return rows


def _print_table(rows: list[dict], wd: Path, console) -> None:
    from rich.table import Table

    from effrag.evaluation.report import md_table

    cols = ["dataset", "method", "k", "n", "recall", "avg_chunks", "latency_s"]
    if any("f1" in r for r in rows):
        cols += ["em", "f1"]
    table = Table(title="EfficientRAG vs Direct-R on the bundled sample (dev)")
    for c in cols:
        table.add_column(c, justify="right" if c not in ("dataset", "method") else "left")
    body = []
    for r in rows:
        cells = [_fmt(r.get(c)) for c in cols]
        table.add_row(*cells)
        body.append(cells)
    console.print(table)
    (wd / "comparison.json").write_text(json.dumps(rows, indent=2))
    (wd / "comparison.md").write_text(md_table(cols, body))
    console.print(f"written: {wd / 'comparison.md'}")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)
