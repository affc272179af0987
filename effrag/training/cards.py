"""What the training recipe knows about each trainable model (:data:`MODELS`: its card's summary, install folder,
metrics and notes) and the model card written from a run's own files (:func:`model_card`).

The recipe itself (data steps, ``accelerate launch train.py``, copying the checkpoint under ``checkpoints/``, a
model's after-install step) is ``scripts/train_models.py``. A card is committed and may ship, so the caller passes
command lines relative to the repo or the data root (:func:`effrag.provenance.portable_text`), never this machine's.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import yaml

TOKEN_KEYS = ["token_precision", "token_recall", "token_f1", "token_accuracy"]
RANKER_KEYS = ["top1", "mrr", "gold_in_top3", "rank_loss"]
# every pool ranker installs the end of its schedule
RANKER_NOTE = ("last checkpoint (the end of the schedule: no dev question chooses it), on dev groups from `effrag "
               "ranker-data`; top1: a group's gold ranked first of 8; mrr: mean reciprocal rank of the gold")


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
        "groups; 6 layers)", "efficientrag-{name}/ranker-teacher", RANKER_KEYS,
        RANKER_NOTE,
        data_note="`effrag ranker-data`: each (query, gold chunk) of the synthesised Labeler records against 7 "
                  "hybrid negatives of the same query (+ the question's own distractors)",
        unit="groups", usage="the teacher of the system's `ranker/` (`configs/ranker_distilled.yaml`); a loop reads "
        "with it when given as `--ranker {path}`", install="last"),
    "ranker_distilled": ModelSpec(
        "EfficientRAG pool ranker, distilled (the teacher's first 2 layers and head, trained at 128 sub-tokens on the "
        "teacher's groups with its scores as soft targets: a read costs a third of the teacher's)",
        "efficientrag-{name}/ranker", RANKER_KEYS,
        RANKER_NOTE,
        data_note="the teacher's training groups, each candidate with the teacher's logit (`effrag ranker-teacher`)",
        unit="groups", usage="the loop ranks its pool with it (`pool_order: rank`); a system folder's `ranker/`",
        install="last"),
    "ranker_distilled_loop": ModelSpec(
        "EfficientRAG pool ranker, distilled further where it reads (the 2-layer student of `ranker_distilled`, one "
        "more epoch on groups made of the loop's own searches over the train questions, the teacher's scores as soft "
        "targets)",
        "efficientrag-{name}/ranker", RANKER_KEYS,
        RANKER_NOTE,
        data_note="`effrag ranker-data --from-loop`: each search of the tuned system's loop (`loop.json`) over the "
                  "train questions, its top 20 hybrid hits as the ranker reads them, each scored by the teacher "
                  "(`effrag ranker-teacher`)",
        unit="groups", usage="the loop ranks its pool with it (`pool_order: rank`); it replaces the system's `ranker/`",
        install="last"),
    "ranker_distilled3": ModelSpec(
        "EfficientRAG pool ranker, 3 layers (the teacher's first 3 layers and head, trained at 128 sub-tokens on "
        "groups made of the loop's own searches over the train questions, the teacher's scores as soft targets: for "
        "the datasets whose bar the 2-layer student cannot keep)",
        "efficientrag-{name}/ranker-3layer", RANKER_KEYS,
        RANKER_NOTE,
        data_note="`effrag ranker-data --from-loop`: each search of the tuned system's loop (`loop.json`) over the "
                  "train questions, its top 20 hybrid hits as the ranker reads them, each scored by the teacher "
                  "(`effrag ranker-teacher`)",
        unit="groups", usage="a loop config reads with it when it says `\"ranker\": \"ranker-3layer\"`; a system "
        "folder's `ranker-3layer/`", install="last"),
    "late_ranker": ModelSpec(
        "EfficientRAG pool ranker, late interaction (MiniLM-L6 reads a query and each chunk apart; a pair scores the "
        "MaxSim of their 128-dim token vectors, so a chunk is read once, at index time; trained on groups made of the "
        "loop's own searches over the train questions, the teacher's scores as soft targets)",
        "efficientrag-{name}/ranker-late", RANKER_KEYS,
        RANKER_NOTE,
        data_note="`effrag ranker-data --from-loop`: each search of the tuned system's loop (`loop.json`) over the "
                  "train questions, its top 20 hybrid hits as the ranker reads them, each scored by the teacher "
                  "(`effrag ranker-teacher`)",
        unit="groups", usage="a loop config reads with it when it says `\"ranker\": \"ranker-late\"`; a system "
        "folder's `ranker-late/`", install="last"),
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
        "with it (`--method searchain --reader {path}`)"),
}


def model_card(name: str, role: str, out_dir: Path, commands: Sequence[str], wall: float | None,
               recipe: str | None = None, installed: str = "best") -> str:
    """The card of a run's ``installed`` checkpoint (``best`` or ``last``) as installed under
    ``checkpoints/<MODELS[role].checkpoint>``, written from the run's own files in ``out_dir`` (``config.yaml``,
    ``run_info.json``, ``results.json``, the checkpoint's ``metrics.json``). ``commands``: the command lines that made
    it, as a user types them from the repo root (data steps, training, any step run on the installed folder);
    ``wall``: this invocation's seconds, if it trained; ``recipe``: the one command that does all of it."""
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
    n, epochs = res["train_examples"], float(t.get("epochs") or 1)
    seen = f", about {round(n * epochs)} of them read in {t['epochs']} epoch" if epochs < 1 else ""
    data = [f"- train: `{d['train_file']}` ({n} {spec.unit} loaded{seen}"
            f"{', max_train_examples=' + str(d['max_train_examples']) if d['max_train_examples'] else ''}"
            f"{'; ' + spec.data_note if spec.data_note else ''})"]
    data += [f"- eval: `{f}`" + (f" (first random {d['max_eval_examples']})" if d["max_eval_examples"] else "")
             for f in d["eval_files"]]
    data += [f"- sha256 `{f}`: {h[:16]}…" for f, h in info["data_sha256"].items()]
    usage = f"; {spec.usage.format(path=where)}" if spec.usage else ""
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


def card_describes_run(card: str, run: str) -> bool:
    """Whether an installed card was written for the run folder ``run`` (its training command names it as
    ``--output_dir``). Two roles install into one folder (the distilled ranker and its loop-trained successor), so a
    reused run keeps the card it finds only when the card is its own."""
    return re.search(rf"--output_dir {re.escape(run)}(\s|$)", card, re.M) is not None

