#!/usr/bin/env bash
# IRRR from the real data: dynamic-oracle training steps (BM25 over the pooled train contexts) for the
# three train sets pooled, dev steps for validation, then `accelerate launch train.py --config configs/irrr.yaml`
# and the best model copied to checkpoints/irrr-all.
#   bash scripts/train_irrr.sh                          # CPU, one process
#   PROCESSES=2 bash scripts/train_irrr.sh              # two gloo processes on CPU
#   LAUNCH="--multi_gpu --num_processes 4" bash scripts/train_irrr.sh --model.name_or_path /models/electra-large
# Env: DATA (default ../shared/data). Extra args are train.py overrides. Every stage resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/train/irrr_minilm}
export HF_HUB_OFFLINE=1
"$BIN/effrag" irrr-data --inputs "$DATA/hotpotqa/train.jsonl" "$DATA/2wikimqa/train.jsonl" "$DATA/musique/train.jsonl" \
  --output runs/irrr/train_all --quiet
for d in hotpotqa 2wikimqa musique; do
  "$BIN/effrag" irrr-data --inputs "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" "$DATA/$d/dev.jsonl" \
    --limit 60 --output "runs/irrr/dev_$d" --quiet
done
if [ -n "${LAUNCH:-}" ]; then launch=($LAUNCH)
elif [ "${PROCESSES:-1}" -gt 1 ]; then export ACCELERATE_USE_CPU=true OMP_NUM_THREADS=1; launch=(--multi_gpu --num_processes "$PROCESSES")
else launch=(--num_processes 1); fi
resume=()
if ls "$OUT"/checkpoints/step_*/trainer_state.json >/dev/null 2>&1; then resume=(--train.resume_from_checkpoint latest); fi
if [ ! -f "$OUT/results.json" ]; then
  "$BIN/accelerate" launch "${launch[@]}" --num_machines 1 --dynamo_backend no train.py \
    --config configs/irrr.yaml --train.output_dir "$OUT" "${resume[@]}" "$@"
fi
rm -rf checkpoints/irrr-all && cp -r "$OUT/best" checkpoints/irrr-all
"$BIN/python" scripts/irrr_model_card.py "$OUT" checkpoints/irrr-all
echo "checkpoints/irrr-all"
