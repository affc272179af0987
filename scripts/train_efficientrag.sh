#!/usr/bin/env bash
# The recommended EfficientRAG model from the real data: data synthesis, Labeler + Filter training, and the loop
# config tuned on each dev file.
#   bash scripts/train_efficientrag.sh all           # the three train sets pooled -> checkpoints/efficientrag-all
#   bash scripts/train_efficientrag.sh hotpotqa      # one train set -> checkpoints/efficientrag-hotpotqa
# Writes checkpoints/efficientrag-<name>/{labeler,filter} (model cards inside), loop-<dataset>.json for hotpotqa,
# 2wikimqa and musique (the loop config with the best dev recall within BUDGET chunks, default 10: the project's bar
# is Direct-R@BAR_K's recall, default 20, with at most 10 chunks) and README.md with the dev figures (Direct-R@7/10/20/30
# next to EfficientRAG, recall at 1..10 chunks, plot).
#
# 1. Annotation-derived synthesis (no LLM; `effrag synthesize --source llm --llm SPEC` for the paper's path) of the
#    train file(s), with NEG_PER_QUERY (default 3) hard negatives per query mined with the dense MiniLM retriever,
#    the one the loop searches with at inference; CONTEXT_NEG (default 0, off) adds that many of each question's own
#    distractor paragraphs as negatives under the question (8 measured: no clear gain, reports/efficientrag/README.md);
#    dev files are synthesised too (validation during training).
# 2. Labeler and Filter training with configs/{labeler,filter}.yaml on every synthesised record.
# 3. scripts/tune_efficientrag.py on each dev file (grid TUNE_GRID), scripts/efficientrag_report.py for the card.
# Every stage resumes; finished stages are reused. About 60-70 min on 2 CPU cores with bf16 (AMX): synthesis 3, Labeler
# 19.5, Filter 1.5 (reports/efficientrag/labeler-2ep), tuning the three dev files with both grids 34 min while a second
# tuning shared the cores (reports/efficientrag/next-query).
# Env: DATA (default ../shared/data), PROCESSES (CPU processes, default 1), BIN (default .venv/bin), LAUNCH (raw
# `accelerate launch` arguments for GPUs, e.g. LAUNCH="--multi_gpu --num_processes 4"), BUDGET, BAR_K, NEG_PER_QUERY, CONTEXT_NEG,
# TUNE_GRID, TUNE_GRID2, NAME (checkpoint name, default the dataset), LABELER_ARGS (Labeler-only overrides),
# TUNE_ONLY=DIR (no synthesis or training: tune DIR/{labeler,filter} and write DIR/loop-<dataset>.json; how the
# package's int8 copy was retuned: NAME=int8 TUNE_ONLY=effrag/pretrained/efficientrag-all). Extra
# args after the dataset go to both trainings, e.g. `... all --train.epochs 2`. SmolLM2-135M Labeler (hours
# per epoch on 2 CPU cores, minutes on a GPU): NAME=all-smollm2 LABELER_ARGS="--model.name_or_path smollm2 --train.lr 5e-5"
set -euo pipefail
cd "$(dirname "$0")/.."
ds=${1:?usage: scripts/train_efficientrag.sh <hotpotqa|2wikimqa|musique|all> [train overrides]}
shift
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
BUDGET=${BUDGET:-10}
BAR_K=${BAR_K:-20}
NEG=${NEG_PER_QUERY:-3}
CTX=${CONTEXT_NEG:-0}
TUNE_GRID=${TUNE_GRID:-"first_hop_k=20 hop_k=5 tag_threshold=0.8 token_threshold=0.2,0.3 query_chunks=1,none filter_threshold=0.1,0.2,0.5 max_hops=3 pool_source=seen pool_order=fused_logit retrieval_weight=8,16,32,64 requery_weight=0,8,16,32"}
# requery_weight: the later hops' queries re-score every chunk read (no extra model call; tuned after the loop).
# query_chunks=1 (only the most confident <Continue> chunk's kept words feed the next query) and a lower
# filter_threshold (the Filter keeps more words) give richer, less diluted next queries: MuSiQue dev +2 to +3
# points at 10 chunks (reports/efficientrag/next-query)
# a second family: the session-3 loop (<Continue> pool topped up to 10 with the likeliest <Terminate> chunks,
# fused order), which the budget then cuts; the tuner keeps whichever family is best on each dev file
TUNE_GRID2=${TUNE_GRID2:-"hop_k=10 max_hops=4 tag_threshold=0.9 token_threshold=0.3 pool_source=continue pool_order=fused retrieval_weight=2,4,8 requery_weight=0,4,8,16 min_candidates=10 max_candidates=10"}
case "$ds" in
  all) inputs=("$DATA/hotpotqa/train.jsonl" "$DATA/2wikimqa/train.jsonl" "$DATA/musique/train.jsonl") ;;
  hotpotqa|2wikimqa|musique) inputs=("$DATA/$ds/train.jsonl") ;;
  *) echo "unknown dataset '$ds' (hotpotqa, 2wikimqa, musique or all)" >&2; exit 2 ;;
esac
export HF_HUB_OFFLINE=1
name=${NAME:-$ds}
ck=${TUNE_ONLY:-"checkpoints/efficientrag-$name"}
if [ -z "${TUNE_ONLY:-}" ]; then
synth="runs/synth/train_${ds}_dense_neg$NEG"
[ "$CTX" != 0 ] && synth="${synth}_ctx$CTX"
"$BIN/effrag" synthesize --inputs "${inputs[@]}" --output "$synth" --source annotation --retriever dense \
  --neg-per-query "$NEG" --context-negatives "$CTX"
for d in hotpotqa 2wikimqa musique; do   # dev records: validation metrics of every run (configs' eval_files)
  "$BIN/effrag" synthesize --inputs "$DATA/$d/dev.jsonl" --output "runs/synth/dev_$d" --source annotation --quiet
done
"$BIN/python" scripts/train_models.py --name "$name" --synth "$synth" --processes "${PROCESSES:-1}" \
  ${LAUNCH:+--launch-args "$LAUNCH"} --labeler-overrides "${LABELER_ARGS:-}" -- --data.max_train_examples 100000 "$@"
fi
tunes=()
for d in hotpotqa 2wikimqa musique; do  # tune on dev only; model outputs are cached across the grid
  # shellcheck disable=SC2086
  "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
    --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" --retriever dense --bf16 --n 0 \
    --grid $TUNE_GRID --chunk-budget "$BUDGET" --output "runs/tune/$name-$d" > /dev/null  # table: runs/tune/*/table.md
  # shellcheck disable=SC2086
  "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
    --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" --retriever dense --bf16 --n 0 \
    --grid $TUNE_GRID2 --chunk-budget "$BUDGET" --output "runs/tune/$name-$d" > /dev/null  # same results.jsonl: best of both
  cp "runs/tune/$name-$d/best.json" "$ck/loop-$d.json"
  tunes+=("$d=runs/tune/$name-$d")
done
card=(--card "$ck")
[ -n "${TUNE_ONLY:-}" ] && card=()  # the tables go to runs/tune/<name>-report only; DIR's card stays as it is
"$BIN/python" scripts/efficientrag_report.py --tune "${tunes[@]}" --budget "$BUDGET" \
  --bar-k "$BAR_K" --output "runs/tune/$name-report" ${card[@]+"${card[@]}"}
echo "EfficientRAG model in $ck: labeler/, filter/, loop-{hotpotqa,2wikimqa,musique}.json, README.md"
