"""Installing a trained model: the recipe's knowledge of each trainable model, its training command, the
checkpoint copied under ``checkpoints/`` with a model card written from the run's own files, and the export of a
trained system or checkpoint into the package as it ships (``effrag/pretrained/``, int8 encoders, its card).

``scripts/train_models.py`` and ``scripts/export_pretrained.py`` are the command lines (the first also builds the
IRRR and reader data, which come from ``data_synthesis``). The functions here take the first's parsed arguments as
``recipe`` (``name``, ``synth``, ``ranker_data``, ``teacher_data``, ``labeler_overrides``, ``launch_args``, ``processes``, ``paper``,
``install``, ``data``, ``datasets``). A card is committed and may ship, so it holds paths relative to the repo or the data root
(:func:`effrag.provenance.portable_text`), never this machine's.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parents[2]  # the checkout: train.py, configs/, checkpoints/, runs/
BIN = Path(sys.executable).parent
DATASETS = ("hotpotqa", "2wikimqa", "musique")  # the recipe's train sets; a shipped system's loop-<dataset>.json
TOKEN_KEYS = ["token_precision", "token_recall", "token_f1", "token_accuracy"]


class ModelSpec(NamedTuple):
    """What the recipe needs to know about one trainable model besides its config."""

    summary: str  # first sentence of the model card
    checkpoint: str  # install folder under checkpoints/ ({name} is --name)
    metric_keys: list[str]  # columns of the card's metrics table
    metrics_note: str  # what the metrics are
    data_note: str = ""  # how the training file was made
    unit: str = "records"  # what one training example is
    usage: str = ""  # how to use the installed model, beyond load_model ({path} is its folder)
    paper_config: bool = False  # has configs/<model>_paper.yaml
    after_install: tuple = ()  # a script run on the installed folder ({path}, {data}: --data), e.g. tuning
    install: str | None = None  # the checkpoint to install when --install is not given (default: best)


MODELS = {
    "labeler": ModelSpec(
        "EfficientRAG Labeler (token head + <Continue>/<Terminate> chunk head)", "efficientrag-{name}/labeler",
        TOKEN_KEYS + ["tag_accuracy", "tag_continue_f1"], "best checkpoint; word level, positive class = keep",
        paper_config=True),
    "filter": ModelSpec(
        "EfficientRAG Filter (token head)", "efficientrag-{name}/filter", TOKEN_KEYS + ["exact_match"],
        "best checkpoint; word level, positive class = keep", paper_config=True),
    "ranker": ModelSpec(
        "EfficientRAG pool ranker, the teacher (one relevance logit per (query, chunk), listwise over hard-negative "
        "groups; 6 layers)", "efficientrag-{name}/ranker-teacher", ["top1", "mrr", "gold_in_top3", "rank_loss"],
        "last checkpoint (the end of the schedule: no dev question chooses it), on dev groups from `effrag "
        "ranker-data`; top1: a group's gold ranked first of 8; mrr: mean reciprocal rank of the gold",
        data_note="`effrag ranker-data`: each (query, gold chunk) of the synthesised Labeler records against 7 "
                  "hybrid negatives of the same query (+ the question's own distractors)",
        unit="groups", usage="the teacher of the system's `ranker/` (`configs/ranker_distilled.yaml`); a loop reads "
        "with it when given as `--ranker {path}`", install="last"),
    "ranker_distilled": ModelSpec(
        "EfficientRAG pool ranker, distilled (the teacher's first 2 layers and head, trained at 128 sub-tokens on the "
        "teacher's groups with its scores as soft targets: a read costs a third of the teacher's)",
        "efficientrag-{name}/ranker", ["top1", "mrr", "gold_in_top3", "rank_loss"],
        "last checkpoint (the end of the schedule: no dev question chooses it), on dev groups from `effrag "
        "ranker-data`; top1: a group's gold ranked first of 8; mrr: mean reciprocal rank of the gold",
        data_note="the teacher's training groups, each candidate with the teacher's logit (`effrag ranker-teacher`)",
        unit="groups", usage="the loop ranks its pool with it (`pool_order: rank`); a system folder's `ranker/`",
        install="last"),
    "irrr": ModelSpec(
        "IRRR (Qi et al., 2021): one encoder with query-term, reader (SPAN/YES/NO/NOANSWER + span) and reranker "
        "heads", "irrr-{name}",
        ["query_token_precision", "query_token_recall", "query_token_f1", "rerank_top1", "type_accuracy",
         "answerable_recall", "span_exact"],
        "best checkpoint, dev steps from `effrag irrr-data` on the first dev questions. query_token_*: oracle "
        "query words; rerank_top1: gold paragraph ranked first among the candidates; answerable_recall: answerable "
        "paths classified SPAN/YES/NO correctly; span_exact: exact start and end",
        data_note="`effrag irrr-data`, dynamic oracle over BM25, recovery augmentation p=0.3, 5 reranker candidates",
        unit="steps", usage="run with `effrag eval --method irrr --irrr-model {path} ...`"),
    "reader": ModelSpec(
        "Extractive reader (start/end span head, [CLS] confidence head f, [CLS] answer-type head span/yes/no; "
        "SearChain's theta = 1.5 applies to f)", "reader-{name}",
        ["answer_exact", "span_exact", "answerable_accuracy", "span_loss", "confidence_loss"],
        "best checkpoint, dev records of the first dev questions. answer_exact: exact span or yes/no type (answering "
        "records); span_exact: best span is the answer (span records); answerable_accuracy: f > 1.5 exactly when "
        "the context answers. QA from gold passages (oracle reading): `python scripts/eval_reader.py`",
        data_note="`write_reader_data`: SQuAD-style spans in gold paragraphs, sub-questions and evidence triples, "
        "the full question over its gold paragraphs read together (span or yes/no; three shuffles, with 1, 0 and 3 "
        "distractors); gold paragraphs without the answer, 1 distractor per question and distractors read together "
        "as no-answer",
        usage="any method answers with it: `effrag eval --method direct-r --reader {path} ...`; SearChain verifies "
        "with it (`--method searchain --reader {path}`)",
        # span decoding (question-echo and length penalties) tuned on the dev files' oracle reading
        after_install=("scripts/tune_reader.py", "--reader", "{path}", "--data", "{data}", "--write",
                       "--output", "{path}/decoding")),
}


# -- data files ------------------------------------------------------------------------------------
def data_tag(recipe) -> str:
    return "all" if sorted(recipe.datasets) == sorted(DATASETS) else "+".join(recipe.datasets)


def data_paths(recipe, model: str) -> tuple[str, list[str]]:
    """Training file and eval files (repo-relative) of the IRRR / reader data step."""
    train = f"runs/{model}/train_{data_tag(recipe)}/{model}.jsonl"
    return train, [f"runs/{model}/dev_{d}/{model}.jsonl" for d in recipe.datasets]


def role_overrides(recipe, role: str, extra: list[str]) -> list[str]:
    """train.py overrides for one model: its data files, the shared overrides, then the Labeler-only ones."""
    if role in ("irrr", "reader"):
        train, evals = data_paths(recipe, role)
        out = ["--data.train_file", train, "--data.eval_files", ",".join(evals)]
    elif role == "ranker":
        out = ["--data.train_file", str(Path(recipe.ranker_data) / "ranker.jsonl")] if recipe.ranker_data else []
    elif role == "ranker_distilled":  # the teacher's groups with its scores; the student starts from the teacher
        out = ["--data.train_file", str(Path(recipe.teacher_data) / "ranker.jsonl")] if recipe.teacher_data else []
        out += ["--model.name_or_path", "checkpoints/" + MODELS["ranker"].checkpoint.format(name=recipe.name)]
    else:
        out = ["--data.train_file", str(Path(recipe.synth) / f"{role}.jsonl")] if recipe.synth else []
    out += list(extra)
    if role == "labeler":
        out += shlex.split(recipe.labeler_overrides)
    return out


# -- training --------------------------------------------------------------------------------------
def launch_command(recipe, role: str, out_dir: Path, extra: list[str]) -> tuple[list[str], dict]:
    """``accelerate launch train.py`` for one model (resuming its latest checkpoint), and its environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launcher = [str(BIN / "accelerate"), "launch"]
    if recipe.launch_args:
        launcher += shlex.split(recipe.launch_args)
    elif recipe.processes > 1:
        # `--cpu --num_processes N` silently runs one process; this gives N gloo processes on CPU
        env["ACCELERATE_USE_CPU"] = "true"
        env.setdefault("OMP_NUM_THREADS", "1")
        launcher += ["--multi_gpu", "--num_processes", str(recipe.processes)]
    else:
        launcher += ["--num_processes", "1"]
    launcher += ["--num_machines", "1", "--dynamo_backend", "no"]
    # relative to the repo (every run starts there): the paths the checkpoint's effrag_config.json records
    config = Path("configs") / (f"{role}_paper.yaml" if recipe.paper else f"{role}.yaml")
    cmd = [*launcher, "train.py", "--config", str(config), "--output_dir",
           str(out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir), *extra]
    if (out_dir / "checkpoints").is_dir() and any((out_dir / "checkpoints").glob("step_*/trainer_state.json")):
        cmd += ["--resume_from_checkpoint", "latest"]
    return cmd, env


def command_line(cmd: list[str], nice: bool = True) -> str:
    """A command as a user would type it from the repo root."""
    text = shlex.join(cmd).replace(str(BIN) + "/", "").replace(str(REPO) + "/", "")
    prefix = "ACCELERATE_USE_CPU=true " if "--multi_gpu" in cmd and "--use_deepspeed" not in cmd else ""
    return f"{prefix}{'nice ' if nice else ''}{text}"


# -- model card ------------------------------------------------------------------------------------
def model_card(name: str, role: str, out_dir: Path, command: list[str], wall: float | None,
               data_commands: list[str] = (), recipe: str | None = None, installed: str = "best") -> str:
    spec = MODELS[role]
    where = "checkpoints/" + spec.checkpoint.format(name=name)
    cfg = yaml.safe_load((out_dir / "config.yaml").read_text())
    info = json.loads((out_dir / "run_info.json").read_text())
    res = json.loads((out_dir / "results.json").read_text())
    best = json.loads((out_dir / installed / "metrics.json").read_text())
    keys = spec.metric_keys
    note = spec.metrics_note if installed == "best" else spec.metrics_note.replace("best checkpoint", "last checkpoint", 1)
    groups = sorted({k.split("/")[0] for k in best if "/" in k})
    rows = [("all", best)] + [(g, {k.split("/", 1)[1]: v for k, v in best.items() if k.startswith(g + "/")}) for g in groups]
    table = ["| eval set | n | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for g, m in rows:
        table.append(f"| {g} | {int(m.get('n', 0))} | " + " | ".join(f"{m.get(k, 0):.4f}" for k in keys) + " |")
    d, t = cfg["data"], cfg["train"]
    data = [f"- train: `{d['train_file']}` ({res['train_examples']} {spec.unit} used"
            f"{', max_train_examples=' + str(d['max_train_examples']) if d['max_train_examples'] else ''}"
            f"{'; ' + spec.data_note if spec.data_note else ''})"]
    data += [f"- eval: `{f}`" + (f" (first random {d['max_eval_examples']})" if d["max_eval_examples"] else "")
             for f in d["eval_files"]]
    data += [f"- sha256 `{f}`: {h[:16]}…" for f, h in info["data_sha256"].items()]
    usage = f"; {spec.usage.format(path=where)}" if spec.usage else ""
    commands = [*data_commands, command_line(command)]
    if spec.after_install:
        commands.append(command_line(["python", *after_install_command(spec, where, "../shared/data")], nice=False))
    return "\n".join([
        f"# {where.removeprefix('checkpoints/').replace('/', ' / ')}",
        "",
        f"{spec.summary} on `{cfg['model']['name_or_path']}`, trained with effrag's `train.py` (task `{cfg['task']}`). "
        f"Load with `effrag.models.load_model(\"{where}\")`{usage}.",
        "",
        "## Data", *data, "",
        "## Training",
        f"- steps: {res['global_step']} (best at step {res['best_step']} by {res['metric_for_best']}; installed: "
        f"{'that best checkpoint' if installed == 'best' else 'the last, step ' + str(res['global_step'])}), "
        f"processes: {res['num_processes']}, mixed precision: {info['mixed_precision']}",
        f"- lr {t['lr']}, batch {t['batch_size']} x accum {t['grad_accum']} x {res['num_processes']} processes, "
        f"max_length {cfg['model']['max_length']}, epochs {t['epochs']}, seed {t['seed']}",
        f"- training loop time: {res['train_time_s']} s; whole run: {res['wall_time_s']} s"
        + (f"; this invocation {wall:.0f} s" if wall else ""),
        f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}",
        "",
        f"## Metrics ({note})", *table, "",
        "## Command", "```", *commands, "```",
        *([f"All of it (data, training, this folder): `{recipe}`"] if recipe else []),
        "Full resolved config: `effrag_config.json` (`training.config`) in this directory.", "",
    ])


def after_install_command(spec: ModelSpec, where: str, data: str) -> list[str]:
    return [a.format(path=where, data=data) for a in spec.after_install]


def install(recipe, role: str, out_dir: Path, cmd: list[str], wall: float | None, data_commands: list[str],
            argv: list[str] = ()) -> Path:
    """Copy the run's best checkpoint to checkpoints/ with its card, then run the model's after-install step
    (``argv``: the recipe command's arguments, for the card).

    A reused run (``wall`` None: it had finished before this invocation) keeps the card already installed
    beside it, which describes the invocation that trained it."""
    from effrag.provenance import portable_text

    spec = MODELS[role]
    dest = REPO / "checkpoints" / spec.checkpoint.format(name=recipe.name)
    card = dest / "README.md"
    old_card = card.read_text() if wall is None and card.is_file() else None
    shutil.rmtree(dest, ignore_errors=True)
    which = recipe.install or spec.install or "best"
    shutil.copytree(out_dir / which, dest)
    again = "python " + shlex.join(["scripts/train_models.py", *argv]).replace(str(REPO) + "/", "")
    # the card is committed (and may ship): paths relative to the repo or the data root, never this machine's
    card.write_text(portable_text(old_card or model_card(recipe.name, role, out_dir, cmd, wall, data_commands, again,
                                                         which)))
    if spec.after_install:
        step = [sys.executable, *after_install_command(spec, str(dest.relative_to(REPO)), str(recipe.data))]
        print("+", shlex.join(step), flush=True)
        subprocess.run(step, cwd=REPO, check=True)
    return dest


# -- export into the package ---------------------------------------------------------------------
def export_system(src: Path, dst: Path, figures: Path | None = None) -> dict:
    """An EfficientRAG system folder (``bash scripts/train_efficientrag.sh all``'s) into ``dst`` as it ships: encoders
    as int8 rows, loop configs, the source cards, ``README.md`` (:func:`shipped_card`) and ``export.json``."""
    from effrag.models import FilterModel, LabelerModel, RankerModel, WEIGHTS_NAME
    from effrag.models.compact import COMPACT_NAME, has_compact_encoder
    from effrag.provenance import file_sha256, portable, provenance

    for need in ("labeler", "filter", "loop.json", *(f"loop-{d}.json" for d in DATASETS)):
        if not (src / need).exists():
            raise FileNotFoundError(f"{src / need} not found: train the model first (bash scripts/train_efficientrag.sh all)")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    sizes, sources = {}, {}
    # every pool ranker the system holds: ranker/ and any ranker-<name>/ a loop config reads with (its "ranker")
    rankers = sorted(d.name for d in src.iterdir() if d.is_dir() and (d.name == "ranker" or d.name.startswith("ranker-")))
    models = [("labeler", LabelerModel), ("filter", FilterModel)] + [(name, RankerModel) for name in rankers]
    for name, cls in models:
        # a folder that already holds int8 rows (a shipped system retuned in place) is copied as it is
        if has_compact_encoder(src / name):
            shutil.copytree(src / name, dst / name)
            sources[name] = {COMPACT_NAME: file_sha256(src / name / COMPACT_NAME)}
        else:
            model = cls.from_pretrained(src / name)
            model.save_pretrained(dst / name, compact=True)
            sources[name] = {WEIGHTS_NAME: file_sha256(src / name / WEIGHTS_NAME)}
            if (src / name / "README.md").is_file():
                shutil.copy(src / name / "README.md", dst / name / "TRAINING.md")
        sizes[name] = (dst / name / COMPACT_NAME).stat().st_size
    for f in ["loop.json", *(f"loop-{d}.json" for d in DATASETS)]:
        shutil.copy(src / f, dst / f)
    if (src / "README.md").is_file():
        shutil.copy(src / "README.md", dst / "RECIPE.md")
    info = portable({"source": str(src), "source_sha256": sources, "int8_bytes": sizes, **provenance()})
    (dst / "export.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    card = shipped_card(src, sizes)
    if figures is not None:  # the quickstart's table for exactly these weights
        card += ("\n## Figures of these (int8) weights\n\nFrom `effrag quickstart` (dense MiniLM retriever, the bundled "
                 "dev questions, corpus = the bundled sample's contexts):\n\n" + figures.read_text().split("\n", 2)[-1])
    (dst / "README.md").write_text(card)
    return info


def export_checkpoint(kind: str, src: Path, dst: Path) -> dict:
    """One checkpoint folder (a reader or an IRRR model) into ``dst``, its encoder as int8 rows."""
    from effrag.models import WEIGHTS_NAME, load_model
    from effrag.models.compact import COMPACT_NAME
    from effrag.provenance import file_sha256, portable, provenance

    model = load_model(src)
    if model.model_type != kind:
        raise ValueError(f"{src}: model_type is {model.model_type!r}, not {kind!r}")
    if dst.exists():
        shutil.rmtree(dst)
    model.save_pretrained(dst, compact=True)
    for name in ("README.md", "metrics.json", "irrr.json"):  # irrr.json: the loop options chosen for the model
        if (src / name).is_file():
            shutil.copy(src / name, dst / ("TRAINING.md" if name == "README.md" else name))
    info = portable({"source": str(src), "source_sha256": {WEIGHTS_NAME: file_sha256(src / WEIGHTS_NAME)},
                     "int8_bytes": {kind: (dst / COMPACT_NAME).stat().st_size}, **provenance()})
    (dst / "export.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return info


def shipped_card(src: Path, sizes: dict, source: str | None = None) -> str:
    """The shipped system's ``README.md``: what it holds, which questions chose what, its cross-fitted figures
    (those of ``src``'s loop files); ``source``: the folder it was exported from, if not ``src``."""
    from effrag.pipelines.base import DEFAULT_RETRIEVER
    from effrag.provenance import portable_path

    mb = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items())
    retuned = ("; its loop configs were then retuned on these int8 weights (`NAME=int8 TUNE_ONLY=effrag/pretrained/"
               "efficientrag-all bash scripts/train_efficientrag.sh all`)") if source else ""
    general = json.loads((src / "loop.json").read_text())
    kind = general.get("retriever") or DEFAULT_RETRIEVER
    rows = []
    for name in ["loop.json", *(f"loop-{d}.json" for d in DATASETS)]:
        cfg = json.loads((src / name).read_text())
        for ds, fig in (cfg.get("crossfit") or {}).items():
            rec = fig["recall"]
            rows.append(f"| `{name}` | {ds} | {fig['n']} | {100 * rec['7']:.1f} | {100 * rec['10']:.1f} | "
                        f"{' / '.join(f'{x:.0f}' for x in fig['forwards'])} |")
    table = "\n".join(["| config | dev file | questions | <= 7 chunks | <= 10 chunks | read per question "
                       "(Labeler / ranker / Filter) |", "|---|---|---:|---:|---:|---|", *rows])
    return f"""# efficientrag-all (shipped with effrag)

The recommended EfficientRAG system, as `bash scripts/train_efficientrag.sh all` makes it: a Labeler and a Filter
(all-MiniLM-L6-v2 fine-tunes) and a pool ranker (since 2026-11-27 a 2-layer student, distilled at 128 sub-tokens from
a 6-layer MiniLM ranker: a read costs 0.23 of a Labeler read) trained on annotation-derived data from the HotpotQA,
2WikiMultihopQA and MuSiQue train files in `../shared/data` (1,099 questions, pooled), and loop configs chosen on the
dev files.
The loop runs over a **{kind}** retriever (the one its configs were tuned for, and the default wherever it is opened).

- `labeler/`, `filter/`, `ranker/` (and `ranker-teacher/`, the 6-layer ranker the student was distilled from, which
  a loop config naming it reads with: `"ranker": "ranker-teacher"`): effrag checkpoints whose encoders are stored as
  int8 rows ({mb}; the rankers' frozen word embeddings are taken from the installed all-MiniLM-L6-v2; see
  `effrag/models/compact.py`), dequantized to fp32 when loaded. `TRAINING.md` in each is its training run's card.
- `loop.json`: the general loop config, chosen jointly on the three dev files: the default, and what to use on a
  corpus of your own. `loop-<dataset>.json`: chosen on that dataset's dev file.
- `RECIPE.md`: the recipe's card with every figure; `export.json`: the sha256 of the source weights, versions
  and the export command.

## Which questions chose what
- The models: trained on the train files only; the ranker's (and its teacher's) installed checkpoint is the end of
  its schedule, and its recipe (2 layers, 128 sub-tokens, half soft targets) was fixed before any dev question ran.
- The loop configs: chosen on the dev files' questions, **except** the bundled sample's 30 per dataset (what
  `effrag quickstart` shows), by the rule each file records under `chosen_on.rule` (since 2026-11-27: the config
  that reads least among those whose recall with at most 7 and 10 chunks keeps the strongest Direct-R@20 and @30 of
  the same questions + one standard error of the per-question difference). The ranker's training-data options, the grid's fixed values and ranges, the loop
  structures and the pool's link options (designed by reading HotpotQA dev pools, 2026-11-26) were settled on the
  same dev files, bundled sample included: only the final pick among the grid's configs is cross-fitted.
- The figures below are **cross-fitted**: each question is scored by the config chosen on the other folds (5
  folds), so no figure comes from the questions that chose it. The chosen configs' own in-sample recall is in
  each file (`in_sample_recall`) and is not a figure to quote.

{table}

Against the strongest plain retriever (BM25, dense, hybrid) on the same questions: *Dev figures* below (the recipe's card, `RECIPE.md`, has the source system's).

## Use it (offline)

```python
from effrag import EfficientRAG
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl")   # loop.json over its {kind} retriever
rag = EfficientRAG.from_pretrained("efficientrag-all", corpus="corpus.jsonl", dataset="musique")  # loop-musique.json
rag.retrieve("Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?")
```

`effrag eval --method efficientrag --questions dev.jsonl --corpus-from train.jsonl ...` uses it by default
(`--model efficientrag-all`, `--er-config .../loop-musique.json` for a per-dataset config).

Exported from `{source or portable_path(src)}` by `python scripts/export_pretrained.py --src {source or portable_path(src)} --dst <this directory>`{retuned}.
Licences of the training data: HotpotQA CC BY-SA 4.0, 2WikiMultihopQA Apache-2.0, MuSiQue CC BY 4.0;
all-MiniLM-L6-v2 Apache-2.0.
"""
