#!/usr/bin/env bash
# Step 8 of the recipe (issue #70; scripts/train_efficientrag.sh): the set-wise pool ranker of a system, and where it
# ships.
#   bash scripts/train_set_ranker.sh SYSTEM_DIR [train dataset ...]   (default: hotpotqa 2wikimqa musique)
# 1. Dumps each question's pool (its first 30 candidates in the loop's own order, scripts/set_ranker.py dump) under
#    every loop config of SYSTEM_DIR (loop-<dataset>.json and loop.json; one dump where the two are equal), for the
#    train questions of the given datasets and the dev questions of all three, over RETRIEVER with ENCODER on the
#    dataset's train + dev corpus.
# 2. Trains the model on the train dumps only (settings fixed by 5-fold cross-validation over the train questions:
#    reports/efficientrag/set-ranker/README.md) into SYSTEM_DIR/set-ranker/: the mean of SEEDS (default 5) runs.
# 3. Scores the dev dumps, reorders the first 10 / 20 / 30, and decides per loop config with the shipping rule
#    (best recall at 7 and 10, cross-fitted; it ships only where the cross-fitted recall beats the loop's own
#    order): set_ranker_top goes into the loop configs the rule picks it for, with the figures beside it.
# Every dump resumes. Env: DATA (default ../shared/data), BIN (default .venv/bin), RETRIEVER (default hybrid),
# ENCODER (default e5-small), OUT (the dumps, default runs/set-ranker/<system folder name>), REPORT_DIR (the scores
# and the decisions, default OUT), EPOCHS (default 10), SEEDS (default 5), KEEP_SAMPLE (1: the bundled sample's dev
# questions choose too, for a run whose DATA is the bundled sample).
set -euo pipefail
cd "$(dirname "$0")/.."
ck=${1:?usage: scripts/train_set_ranker.sh SYSTEM_DIR [train dataset ...]}
shift
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
RETRIEVER=${RETRIEVER:-hybrid}
ENCODER=${ENCODER:-e5-small}
OUT=${OUT:-runs/set-ranker/$(basename "$ck")}
train_sets=("$@")
[ ${#train_sets[@]} -gt 0 ] || train_sets=(hotpotqa 2wikimqa musique)
REPORT_DIR=${REPORT_DIR:-$OUT}
mkdir -p "$OUT" "$REPORT_DIR"
source scripts/recipe_lib.sh  # same_config
dump() {  # $1 dataset, $2 split, $3 own|all
  local f="$ck/loop-$1.json"
  [ "$3" = all ] && f="$ck/loop.json"
  "$BIN/python" scripts/set_ranker.py dump --model "$ck" --er-config "$f" --questions "$DATA/$1/$2.jsonl" \
    --corpus-from "$DATA/$1/train.jsonl" "$DATA/$1/dev.jsonl" --retriever "$RETRIEVER" --encoder "$ENCODER" \
    --bf16 --er-bf16 --n 0 --out "$OUT/$1-$2-$3.jsonl"
}
train_dumps=() dev_dumps=() joint=()
for d in hotpotqa 2wikimqa musique; do
  cfgs=(all)
  same_config "$ck/loop-$d.json" "$ck/loop.json" || cfgs=(own all)
  for c in "${cfgs[@]}"; do
    dump "$d" dev "$c"
    dev_dumps+=("$OUT/$d-dev-$c.jsonl")
    if [[ " ${train_sets[*]} " == *" $d "* ]]; then
      dump "$d" train "$c"
      train_dumps+=("$OUT/$d-train-$c.jsonl")
    fi
  done
  joint+=("$d-dev-all")
done
"$BIN/python" scripts/set_ranker.py train --train "${train_dumps[@]}" --epochs "${EPOCHS:-10}" --seeds "${SEEDS:-5}" \
  --out "$ck/set-ranker"
"$BIN/python" scripts/set_ranker.py score --model "$ck/set-ranker" --tops 10,20,30 --dumps "${dev_dumps[@]}" \
  --out "$REPORT_DIR/scores.jsonl.gz"
"$BIN/python" scripts/set_ranker.py report --scores "$REPORT_DIR/scores.jsonl.gz" --joint "${joint[@]}" \
  --out "$REPORT_DIR/decisions" $([ "${KEEP_SAMPLE:-0}" = 1 ] && echo --keep-sample)
"$BIN/python" scripts/set_ranker.py ship --decisions "$REPORT_DIR/decisions.json" --system "$ck" \
  --report "$REPORT_DIR/decisions.md"
