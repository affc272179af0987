#!/usr/bin/env bash
# The figures of reports/efficientrag/set-ranker/ beyond the recipe's step (scripts/train_set_ranker.sh): the
# settings chosen by cross-validation over the train questions, the ablations (pointwise, no link inputs), and the
# 1-hop control. Run after the step, with the same OUT (its dumps are reused).
#   OUT=runs/set-ranker/efficientrag-all bash scripts/set_ranker_study.sh effrag/pretrained/efficientrag-all
set -euo pipefail
cd "$(dirname "$0")/.."
ck=${1:?usage: scripts/set_ranker_study.sh SYSTEM_DIR}
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/set-ranker/$(basename "$ck")}
REPORT=${REPORT:-reports/efficientrag/set-ranker}
S=(python scripts/set_ranker.py)
S=("$BIN/${S[0]}" "${S[@]:1}")
train=("$OUT"/*-train-own.jsonl "$OUT"/*-train-all.jsonl)
dev=("$OUT"/*-dev-own.jsonl "$OUT"/*-dev-all.jsonl)
links=(linked_rel named_by_top log_named_by log_names)

# 1. the settings: 5-fold cross-validation over the train questions (held-out recall at 5 / 7 / 10, the model over
# the pool's first 10); the recipe's are the first line's (the mean of 5 seeds), the rest are single runs
: > "$REPORT/train-cv.jsonl"
for opts in "--epochs 10 --seeds 5" "--epochs 10" "--epochs 5" "--epochs 20" "--epochs 10 --layers 1" \
    "--epochs 10 --pointwise" "--epochs 10 --drop ${links[*]}" "--epochs 10 --pointwise --drop ${links[*]}" \
    "--epochs 10 --no-links --drop ${links[*]}"; do
  # shellcheck disable=SC2086
  "${S[@]}" train --train "${train[@]}" --cv 5 $opts --out /dev/null >> "$REPORT/train-cv.jsonl"
done

# 2. the ablations on the dev questions: the same recipe pointwise, without the link inputs, without any link; and
# each of the shipped ensemble's members alone (one seed each: how much one training run moves the figures)
mkdir -p "$OUT/ablation"
"${S[@]}" train --train "${train[@]}" --epochs 10 --seeds 5 --pointwise --out "$OUT/ablation/pointwise"
"${S[@]}" train --train "${train[@]}" --epochs 10 --seeds 5 --drop "${links[@]}" --out "$OUT/ablation/no-link-inputs"
"${S[@]}" train --train "${train[@]}" --epochs 10 --seeds 5 --drop "${links[@]}" --no-links \
  --out "$OUT/ablation/no-links"
"${S[@]}" score --model "$ck/set-ranker" "$OUT/ablation/pointwise" "$OUT/ablation/no-link-inputs" \
  "$OUT/ablation/no-links" "$ck"/set-ranker/member* --tops 10,20,30 --dumps "${dev[@]}" \
  --out "$REPORT/ablation-scores.jsonl.gz"
"${S[@]}" report --scores "$REPORT/ablation-scores.jsonl.gz" --out "$REPORT/ablation" \
  --joint hotpotqa-dev-all 2wikimqa-dev-all musique-dev-all > /dev/null

# 3. the 1-hop control: each dataset's own config with max_hops 1 reading the hybrid's top 30, a model trained on
# the train questions' 1-hop pools, and the shipped model
mkdir -p "$OUT/1hop"
for d in hotpotqa 2wikimqa musique; do
  for split in train dev; do
    "${S[@]}" dump --model "$ck" --er-config "$ck/loop-$d.json" --grid max_hops=1 first_hop_k=30 \
      --questions "$DATA/$d/$split.jsonl" --corpus-from "$DATA/$d/train.jsonl" "$DATA/$d/dev.jsonl" \
      --retriever hybrid --encoder e5-small --bf16 --er-bf16 --n 0 --out "$OUT/1hop/$d-$split-1hop.jsonl"
  done
done
"${S[@]}" train --train "$OUT"/1hop/*-train-1hop.jsonl --epochs 10 --seeds 5 --out "$OUT/1hop/set-ranker-1hop"
"${S[@]}" score --model "$OUT/1hop/set-ranker-1hop" "$ck/set-ranker" --tops 10,20,30 \
  --dumps "$OUT"/1hop/*-dev-1hop.jsonl --out "$REPORT/1hop-scores.jsonl.gz"
"${S[@]}" report --scores "$REPORT/1hop-scores.jsonl.gz" --out "$REPORT/1hop" > /dev/null
