"""Train an effrag model (Labeler, Filter, or any registered task) with one accelerate loop.

    accelerate launch train.py --config configs/labeler.yaml [--train.lr 1e-5 --data.train_file X ...]
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 train.py --config configs/filter.yaml
    accelerate launch train.py --config configs/labeler.yaml --resume_from_checkpoint latest
    accelerate launch train.py --config configs/labeler.yaml --eval_only checkpoints/efficientrag-all/labeler

Overrides are dotted config keys (see effrag/training/config.py); ``--output_dir`` and
``--resume_from_checkpoint`` are shortcuts for the ``train.`` keys.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local dirs / packages only
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHORTCUTS = {"--output_dir": "--train.output_dir", "--resume_from_checkpoint": "--train.resume_from_checkpoint"}


def main(argv: list[str] | None = None) -> int:
    from effrag.training import ConfigError, evaluate_only, load_config, train
    from effrag.training.data import RecordError

    args = list(sys.argv[1:] if argv is None else argv)
    config_path = eval_dir = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, val = args[i].partition("=")
        if key in ("--config", "--eval_only"):
            if not eq:
                if i + 1 >= len(args):
                    print(f"error: {key} needs a value", file=sys.stderr)
                    return 2
                val, i = args[i + 1], i + 1
            config_path, eval_dir = (val, eval_dir) if key == "--config" else (config_path, val)
        elif key in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            rest.append(SHORTCUTS.get(key, key) + (eq + val if eq else ""))
        i += 1
    try:
        cfg = load_config(config_path, rest)
        if eval_dir:
            evaluate_only(cfg, eval_dir)
        else:
            train(cfg)
    except (ConfigError, RecordError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
