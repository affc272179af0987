#!/usr/bin/env bash
# EfficientRAG checkpoints for one dataset (or all three pooled) from the real data:
#   bash scripts/train_efficientrag.sh hotpotqa      # -> checkpoints/efficientrag-hotpotqa/{labeler,filter}
#   bash scripts/train_efficientrag.sh all           # the three train sets pooled -> checkpoints/efficientrag-all
# Annotation-derived synthesis (no LLM; `effrag synthesize --source llm --llm SPEC` for the paper's LLM path)
# of the train file(s) and of every dev file (validation during training), then Labeler and Filter training
# with configs/{labeler,filter}.yaml. Every stage resumes; finished stages are reused.
# Env: DATA (default ../shared/data), PROCESSES (CPU processes, default 1), extra args after the dataset
# go to both trainings, e.g. `bash scripts/train_efficientrag.sh musique --train.epochs 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
ds=${1:?usage: scripts/train_efficientrag.sh <hotpotqa|2wikimqa|musique|all> [train overrides]}
shift
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
case "$ds" in
  all) inputs=("$DATA/hotpotqa/train.jsonl" "$DATA/2wikimqa/train.jsonl" "$DATA/musique/train.jsonl") ;;
  hotpotqa|2wikimqa|musique) inputs=("$DATA/$ds/train.jsonl") ;;
  *) echo "unknown dataset '$ds' (hotpotqa, 2wikimqa, musique or all)" >&2; exit 2 ;;
esac
export HF_HUB_OFFLINE=1
"$BIN/effrag" synthesize --inputs "${inputs[@]}" --output "runs/synth/train_$ds" --source annotation
for d in hotpotqa 2wikimqa musique; do   # dev records: validation metrics of every run (configs' eval_files)
  "$BIN/effrag" synthesize --inputs "$DATA/$d/dev.jsonl" --output "runs/synth/dev_$d" --source annotation --quiet
done
"$BIN/python" scripts/train_models.py --name "$ds" --synth "runs/synth/train_$ds" \
  --processes "${PROCESSES:-1}" ${@:+-- "$@"}
