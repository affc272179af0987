"""``train.py``'s command line (its ``main``; ``train.py`` at the repository root is the launcher ``accelerate
launch`` runs). Train an effrag model (Labeler, Filter, IRRR, reader, or any registered task) with one accelerate loop.

    accelerate launch train.py --config configs/labeler.yaml [--train.lr 1e-5 --data.train_file X ...]
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 train.py --config configs/filter.yaml
    accelerate launch train.py --config configs/labeler.yaml --resume_from_checkpoint latest
    accelerate launch train.py --config configs/labeler.yaml --eval_only checkpoints/efficientrag-all/labeler
    accelerate launch train.py --config reader --data.train_file runs/reader/train_all/reader.jsonl
    accelerate launch train.py --config labeler --data.train_file runs/synth/train_all/dataset  # Arrow: docs/datasets.md

``--config`` is a YAML file or the name of a packaged default config (labeler, filter, irrr, reader,
labeler_paper, filter_paper: effrag/configs/, linked as configs/). Overrides are dotted config keys
(see effrag/training/config.py); ``--output_dir`` and ``--resume_from_checkpoint`` are shortcuts for
the ``train.`` keys. scripts/train_models.py runs the whole recipe of a model: data, training, install.

Rerunning the same command after a kill resumes from the latest checkpoint in the output directory
(it prints which, and the step) and ends as the unbroken run would have; a finished run (results.json
there) is left as it is (exit 0, nothing retrained); ``--overwrite`` deletes the output directory's run
and trains from step 0. Errors in the config or the data end with one line ``train.py: error: ...``
and exit status 2 (``accelerate launch`` then adds its own report of the failed child: pass
``accelerate launch -q`` to keep a one-process launch to that line).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local dirs / packages only
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHORTCUTS = {"--output_dir": "--train.output_dir", "--resume_from_checkpoint": "--train.resume_from_checkpoint"}


def error(message: str) -> int:
    """One line on stderr (from the first process only under a multi-process launch); exit status 2."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"train.py: error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    config_path = eval_dir = None
    overwrite = False
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, val = args[i].partition("=")
        if key in ("--config", "--eval_only"):
            if not eq:
                if i + 1 >= len(args):
                    return error(f"{key} needs a value")
                val, i = args[i + 1], i + 1
            config_path, eval_dir = (val, eval_dir) if key == "--config" else (config_path, val)
        elif key == "--overwrite":
            overwrite = True
        elif key in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            rest.append(SHORTCUTS.get(key, key) + (eq + val if eq else ""))
        i += 1
    from effrag.integrity import IntegrityError
    from effrag.training import ConfigError, evaluate_only, load_config, train
    from effrag.training.data import RecordError

    try:
        cfg = load_config(config_path, rest)
        if eval_dir:
            evaluate_only(cfg, eval_dir)
        else:
            train(cfg, overwrite=overwrite)
    except (ConfigError, RecordError, IntegrityError, FileNotFoundError) as e:  # a damaged checkpoint too
        return error(' '.join(str(e).split()))
    return 0

