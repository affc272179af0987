"""Train an effrag model (Labeler, Filter, IRRR, reader, ranker, or any registered task) with one accelerate loop.

    accelerate launch train.py --config configs/labeler.yaml [--train.lr 1e-5 --data.train_file X ...]
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 train.py --config configs/filter.yaml

Every option, resuming and the error lines: ``train.py --help`` (:mod:`effrag.training.cli`, where the command line
lives; this file is what ``accelerate launch`` starts).
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local dirs / packages only
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from effrag.training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
