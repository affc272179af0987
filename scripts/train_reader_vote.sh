#!/usr/bin/env bash
# The reader that meets the oracle-reading targets: three readers answering by majority vote -> checkpoints/reader-vote.
#   bash scripts/train_reader_vote.sh
# 1. checkpoints/reader-all: MiniLM, configs/reader.yaml (2 epochs; 54 min on 2 CPU cores with 2 processes);
# 2. checkpoints/reader-smol: the same data and config on the SmolLM2-135M backbone, 1 epoch (76 min, 1 process);
# 3. checkpoints/reader-smol2: one more epoch from reader-smol at lr 5e-5 (72 min);
# 4. checkpoints/reader-vote: the vote folder over the three (scripts/build_reader_vote.py, seconds).
# Each training is followed by its span-decoding tuning on the dev files (scripts/tune_reader.py --write); finished
# runs are reused and a stopped one resumes (scripts/train_models.py). Minutes on a GPU: LAUNCH="--num_processes 1".
# Env: DATA (default ../shared/data), BIN (default .venv/bin), PROCESSES (MiniLM reader, default 2), LAUNCH (raw
# `accelerate launch` arguments for the SmolLM2 readers). Dev figures: reports/reader/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
PROCESSES=${PROCESSES:-2}
launch=()
[ -n "${LAUNCH:-}" ] && launch=(--launch-args "$LAUNCH")
"$BIN/python" scripts/train_models.py --models reader --name all --processes "$PROCESSES"
"$BIN/python" scripts/train_models.py --models reader --name smol --processes 1 "${launch[@]}" -- \
  --model.name_or_path smollm2 --train.epochs 1 --train.torch_threads 2
"$BIN/python" scripts/train_models.py --models reader --name smol2 --processes 1 "${launch[@]}" -- \
  --model.name_or_path checkpoints/reader-smol --train.epochs 1 --train.lr 5e-5 --train.torch_threads 2
"$BIN/python" scripts/build_reader_vote.py --members checkpoints/reader-all checkpoints/reader-smol \
  checkpoints/reader-smol2 --output checkpoints/reader-vote
