"""Write the model card (README.md) of an IRRR checkpoint from its training run's own files.

    python scripts/irrr_model_card.py runs/train/irrr_minilm checkpoints/irrr-all
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

KEYS = ["query_token_precision", "query_token_recall", "query_token_f1", "rerank_top1", "type_accuracy",
        "answerable_recall", "span_exact"]


def card(run: Path, name: str) -> str:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    res = json.loads((run / "results.json").read_text())
    info = json.loads((run / "run_info.json").read_text())
    best = json.loads((run / "best" / "metrics.json").read_text())
    groups = sorted({k.split("/")[0] for k in best if "/" in k})
    rows = [("all", best)] + [(g, {k.split("/", 1)[1]: v for k, v in best.items() if k.startswith(g + "/")}) for g in groups]
    table = ["| eval set | steps | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 2) + "|"]
    table += [f"| {g} | {int(m.get('n', 0))} | " + " | ".join(f"{m.get(k, 0):.4f}" for k in KEYS) + " |" for g, m in rows]
    return "\n".join([
        f"# {name}",
        "",
        f"IRRR (Qi et al., 2021): one `{cfg['model']['name_or_path']}` encoder with query-term, reader "
        "(SPAN/YES/NO/NOANSWER + span) and reranker heads, trained with effrag's `train.py` (task `irrr`). "
        f"Load with `effrag.models.load_model(\"checkpoints/{name}\")`; run with `effrag eval --method irrr "
        f"--irrr-model checkpoints/{name} ...`.",
        "",
        "## Data",
        f"- train: `{cfg['data']['train_file']}` ({res.get('train_examples')} steps; `effrag irrr-data`, "
        "dynamic oracle over BM25, recovery augmentation p=0.3, 5 reranker candidates)",
        *[f"- eval: `{f}`" for f in cfg["data"]["eval_files"]],
        *[f"- sha256 `{f}`: {h[:16]}…" for f, h in info["data_sha256"].items()],
        "",
        "## Training",
        f"- steps: {res['global_step']} (best at {res['best_step']} by {res['metric_for_best']}), "
        f"processes: {res['num_processes']}, mixed precision: {info['mixed_precision']}",
        f"- lr {cfg['train']['lr']}, batch {cfg['train']['batch_size']} steps x accum {cfg['train']['grad_accum']}, "
        f"max_length {cfg['model']['max_length']}, epochs {cfg['train']['epochs']}, seed {cfg['train']['seed']}",
        f"- training loop time: {res['train_time_s']} s; whole run: {res['wall_time_s']} s",
        f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}",
        "",
        "## Metrics (best checkpoint, dev steps from `effrag irrr-data` on the first 60 dev questions)",
        "query_token_*: oracle query words; rerank_top1: gold paragraph ranked first among the candidates; "
        "answerable_recall: answerable paths classified SPAN/YES/NO correctly; span_exact: exact start and end.",
        "",
        *table, "",
        "## Command", "```", "bash scripts/train_irrr.sh", "```", "",
    ])


if __name__ == "__main__":
    run, dest = Path(sys.argv[1]), Path(sys.argv[2])
    (dest / "README.md").write_text(card(run, dest.name))
    print(dest / "README.md")
