"""A task's tokenised training and evaluation sets, from JSONL (in memory) or Arrow (memory-mapped).

Kept apart from :mod:`.loop` (which only iterates them) and from :mod:`.data` / :mod:`.hf_data`
(which read records), so each reading path has one home and the loop one way to get its data.
"""
from __future__ import annotations

from .config import Config
from .data import FeatureDataset, group_ids, read_jsonl, select
from .hf_data import arrow_features, is_arrow_source, read_records
from .tasks import Task


def feature_length(f: dict) -> int:
    """Tokens in a feature: one sequence's length, or a multi-sequence feature's own ``length`` (IRRR steps)."""
    return f["length"] if "length" in f else len(f["input_ids"])


def build_eval_dataset(task: Task, model, cfg: Config, files: list[str]) -> FeatureDataset | None:
    records = []
    for f in files:
        records += select(read_records(f, task.check_record, task.name), cfg.data.sources, cfg.data.max_eval_examples,
                          cfg.train.seed)
    if not records:
        return None
    groups, names = group_ids(records)
    feats = [{**x, "group": g} for x, g in zip(task.featurize(model, records, cfg.model.max_length), groups)]
    feats.sort(key=feature_length)  # metrics are sums: order is free, padding is not
    return FeatureDataset(feats, names)


def build_train_dataset(task: Task, model, cfg: Config, accelerator=None):
    """The tokenised training set: in memory from JSONL, or memory-mapped Arrow (:mod:`.hf_data`)."""
    d = cfg.data
    if not is_arrow_source(d.train_file):
        records = select(read_jsonl(d.train_file, task.check_record), d.sources, d.max_train_examples, cfg.train.seed)
        return FeatureDataset(task.featurize(model, records, cfg.model.max_length))

    def build():
        return arrow_features(d.train_file, task_name=task.name, check=task.check_record,
                              featurize=lambda recs: task.featurize(model, recs, cfg.model.max_length),
                              length=feature_length, tokenizer=model.tokenizer, max_length=cfg.model.max_length,
                              sources=d.sources, limit=d.max_train_examples, seed=cfg.train.seed)

    if accelerator is None:
        return build()
    with accelerator.main_process_first():  # the main process tokenises into the cache, the others read it
        return build()


def train_lengths(ds) -> list[int]:
    return ds.lengths if hasattr(ds, "lengths") else [feature_length(f) for f in ds.features]
