#!/usr/bin/env bash
# The recommended EfficientRAG system from the real data: data synthesis, Labeler + Filter + pool ranker training,
# and the loop configs chosen on the dev files with cross-fitted figures.
#   bash scripts/train_efficientrag.sh all           # the three train sets pooled -> checkpoints/efficientrag-all
#   bash scripts/train_efficientrag.sh hotpotqa      # one train set -> checkpoints/efficientrag-hotpotqa
# Writes the system folder checkpoints/efficientrag-<name>/: labeler/, filter/, ranker/ (the distilled one, trained
# last on the loop's own reads; its teacher in ranker-teacher/, the late-interaction one in ranker-late/; model cards
# inside),
# loop-<dataset>.json for hotpotqa, 2wikimqa and musique (chosen on that dev file), loop.json (one config chosen
# jointly on the three: the default for a corpus of your own) and README.md. Every loop config records the retriever
# it was tuned for (RETRIEVER, default hybrid) and the cross-fitted recall of the protocol that chose it.
#
# 1. Annotation-derived synthesis (no LLM; `effrag synthesize --source llm --llm SPEC` for the paper's path) of the
#    train file(s), with NEG_PER_QUERY (default 3) dense hard negatives per query for the Labeler's tag; dev files
#    are synthesised too (validation during training).
# 2. Labeler and Filter training with configs/{labeler,filter}.yaml on every synthesised record.
# 3. The pool ranker: `effrag ranker-data` (each gold chunk of the synthesised records against 7 hybrid negatives of
#    the same query) and configs/ranker.yaml train the teacher (6 layers, installed as ranker-teacher/); `effrag
#    ranker-teacher` scores its groups with it and configs/ranker_distilled.yaml trains the system's ranker/ from
#    its first 2 layers on those scores (a third of the reading cost); the last checkpoints are installed (no dev
#    question chooses them).
# 4. scripts/tune_efficientrag.py on each dev file (the grid of effrag/configs/efficientrag_recipe.yaml, or TUNE_GRID,
#    over RETRIEVER, every question's result kept; with the teacher too, efficientrag_recipe_teacher.yaml's grid, so
#    that a dataset whose bar the student cannot keep cheaply reads with the teacher: "ranker": "ranker-teacher"),
#    then scripts/efficientrag_report.py: per-dataset and joint configs chosen on the dev questions but the bundled
#    sample's (the quickstart's) by recall first (issue #67): the best recall at <= 7 and <= 10 chunks, and
#    loop-<dataset>.json ships loop.json's config where the dataset's own pick does not beat it cross-fitted
#    (FALL_BACK=0: never; RULE=cheapest: the cheapest cost point that keeps the strongest Direct-R + MARGIN, the
#    rule before; PREFER=simple or cheap: the simplest pool weights, or the cheapest cost point, within one standard
#    error of the best), 5-fold cross-fitted recall at <= 7 and <= 10 chunks against the strongest of BM25, dense and hybrid Direct-R,
#    the cost points' Pareto table and the card.
# 5. The student again, where it reads (LOOP_DISTILL=0 skips it): `effrag ranker-data --from-loop` makes one group of
#    each search the tuned system's loop (loop.json) makes over the train questions (the query as the ranker reads
#    it, the top 20 hits), the teacher scores them, configs/ranker_distilled_loop.yaml trains the student one more
#    epoch on them (installed over ranker/), configs/late_ranker.yaml trains the late-interaction ranker on the same
#    groups (installed as ranker-late/: a chunk is read once, at index time), `effrag ranker-codec` fits its vectors'
#    codec on the train passages (stored at about 1.5 KB a chunk), and step 4 runs again with the student's
#    rows and the late ranker's (runs/tune/<name>-<dataset>-loop, runs/tune/<name>-<dataset>-late).
# 6. The set-wise pool ranker (SET_RANKER=0 skips it): scripts/train_set_ranker.sh trains set-ranker/ on the train
#    questions' pools and writes into each loop config whether the shipping rule picks it (set_ranker_top).
# Every stage resumes; finished stages are reused.
# Env: DATA (default ../shared/data), PROCESSES (CPU processes, default 1), BIN (default .venv/bin), LAUNCH (raw
# `accelerate launch` arguments for GPUs, e.g. LAUNCH="--multi_gpu --num_processes 4"), RETRIEVER (the loop's
# retriever, default hybrid), ENCODER (its dense leg's encoder, default e5-small; the loop configs name it), NEG_PER_QUERY, CONTEXT_NEG, TUNE_GRID, FOLDS (default 5), RULE (best, the default, or cheapest),
# MARGIN (points, or se: one standard error, the default), PREFER (recall, the default, simple or cheap), FALL_BACK (1, the default, or 0), LOOP_DISTILL (0:
# no step 5), NAME (checkpoint name, default the dataset), LABELER_ARGS (Labeler-only overrides), RANKER_ARGS
# (ranker-only overrides), TUNE_ONLY=DIR (no synthesis
# or training: tune the system DIR/{labeler,filter,ranker} and write DIR/loop*.json; how the package's int8 copy is
# tuned: NAME=int8 TUNE_ONLY=effrag/pretrained/efficientrag-all). Extra args after the dataset go to the Labeler and
# Filter trainings, e.g. `... all --train.epochs 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
ds=${1:?usage: scripts/train_efficientrag.sh <hotpotqa|2wikimqa|musique|all> [train overrides]}
shift
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
RETRIEVER=${RETRIEVER:-hybrid}
ENCODER=${ENCODER:-e5-small}
FOLDS=${FOLDS:-5}
NEG=${NEG_PER_QUERY:-3}
CTX=${CONTEXT_NEG:-0}
# The loop's grid: effrag/configs/efficientrag_recipe.yaml (what each option does is said there); TUNE_GRID="NAME=V1,V2
# ..." replaces it.
if [ -n "${TUNE_GRID:-}" ]; then
  read -ra grid_args <<< "$TUNE_GRID"
  grid_args=(--grid "${grid_args[@]}")
else
  grid_args=(--grid-file effrag/configs/efficientrag_recipe.yaml)
fi
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
  "$BIN/effrag" ranker-data --synth "runs/synth/dev_$d" --inputs "$DATA/$d/dev.jsonl" --output "runs/ranker/dev_$d" \
    --retriever bm25 --groups-per-positive 1 --quiet
done
"$BIN/effrag" ranker-data --synth "$synth" --inputs "${inputs[@]}" --output "runs/ranker/train_$ds" \
  --retriever hybrid --groups-per-positive 1 --info --question-first-hop-only
"$BIN/python" scripts/train_models.py --name "$name" --synth "$synth" --processes "${PROCESSES:-1}" \
  ${LAUNCH:+--launch-args "$LAUNCH"} --labeler-overrides "${LABELER_ARGS:-}" -- --data.max_train_examples 100000 "$@"
# shellcheck disable=SC2086
"$BIN/python" scripts/train_models.py --models ranker --name "$name" --ranker-data "runs/ranker/train_$ds" \
  --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"} -- ${RANKER_ARGS:-}
"$BIN/effrag" ranker-teacher --data "runs/ranker/train_$ds" --teacher "checkpoints/efficientrag-$name/ranker-teacher" \
  --output "runs/ranker/train_${ds}_teacher" --bf16
"$BIN/python" scripts/train_models.py --models ranker_distilled --name "$name" \
  --teacher-data "runs/ranker/train_${ds}_teacher" --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"}
fi
tune_and_report() {  # $1: the student's tune folders' suffix; the teacher's rows are shared by both rounds
  local d tunes=()
  for d in hotpotqa 2wikimqa musique; do  # every dev question's result is kept: the report cross-fits them
    # shellcheck disable=SC2086
    "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" --ranker "$ck/ranker" \
      --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" --retriever "$RETRIEVER" --encoder "$ENCODER" --bf16 --er-bf16 \
      --n 0 "${grid_args[@]}" --output "runs/tune/$name-$d$1" > /dev/null  # table: runs/tune/*/table.md
    tunes+=("$d=runs/tune/$name-$d$1")
    if [ -d "$ck/ranker-teacher" ]; then  # the teacher's rows too: the report chooses among both rankers' configs
      "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
        --ranker "$ck/ranker-teacher" --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" \
        --retriever "$RETRIEVER" --encoder "$ENCODER" --bf16 --er-bf16 --n 0 --grid-file effrag/configs/efficientrag_recipe_teacher.yaml \
        --output "runs/tune/$name-$d-teacher" > /dev/null
      tunes+=("$d=runs/tune/$name-$d-teacher@ranker-teacher")
    fi
    if [ -d "$ck/ranker-late" ]; then  # and the late-interaction ranker's (step 5): reads that cost no forward
      # shellcheck disable=SC2086
      "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
        --ranker "$ck/ranker-late" --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" \
        --retriever "$RETRIEVER" --encoder "$ENCODER" --bf16 --er-bf16 --n 0 "${grid_args[@]}" --output "runs/tune/$name-$d-late" > /dev/null
      tunes+=("$d=runs/tune/$name-$d-late@ranker-late")
    fi
  done
  # the bar: the strongest of BM25, dense and hybrid with MiniLM and with the loop's encoder
  local encoders=(minilm)
  [ "$ENCODER" = minilm ] || encoders+=("$ENCODER")
  "$BIN/python" scripts/efficientrag_report.py --tune "${tunes[@]}" --data "$DATA" --folds "$FOLDS" --system "$ck" \
    --encoders "${encoders[@]}" --rule "${RULE:-best}" --margin "${MARGIN:-se}" --prefer "${PREFER:-recall}" \
    $([ "${FALL_BACK:-1}" = 0 ] || echo --fall-back) --output "runs/tune/$name-report$1"
}
tune_and_report ""
if [ -z "${TUNE_ONLY:-}" ] && [ "${LOOP_DISTILL:-1}" != 0 ]; then
  # 5. the student again, where it reads: the tuned loop's own searches over the train questions, scored by the
  # teacher, one more epoch (configs/ranker_distilled_loop.yaml, installed over ranker/), its rows tuned and chosen
  "$BIN/effrag" ranker-data --from-loop "$ck" --inputs "${inputs[@]}" --output "runs/ranker/train_${ds}_loop" \
    --depth 20 --batch-size 32
  "$BIN/effrag" ranker-teacher --data "runs/ranker/train_${ds}_loop" --teacher "$ck/ranker-teacher" \
    --output "runs/ranker/train_${ds}_loop_teacher" --bf16
  "$BIN/python" scripts/train_models.py --models ranker_distilled_loop,late_ranker --name "$name" \
    --teacher-data "runs/ranker/train_${ds}_loop_teacher" --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"}
  # the late ranker's codec (issue #68): its chunk vectors stored as product-quantised codes, fitted on the train
  # files' passages, before its rows are tuned (the loop reads the codes, so the tuning does too)
  "$BIN/effrag" ranker-codec --model "$ck/ranker-late" --inputs "${inputs[@]}"
  tune_and_report "-loop"
fi
if [ "${SET_RANKER:-1}" != 0 ]; then
  # 6. the set-wise pool ranker (issue #70): trained on the train questions' pools under the loop configs just
  # written, shipped into a loop config only where the shipping rule picks it (scripts/train_set_ranker.sh)
  train_sets=("$ds")
  [ "$ds" = all ] && train_sets=(hotpotqa 2wikimqa musique)
  DATA="$DATA" BIN="$BIN" RETRIEVER="$RETRIEVER" ENCODER="$ENCODER" bash scripts/train_set_ranker.sh "$ck" \
    "${train_sets[@]}"
fi
echo "EfficientRAG system in $ck: labeler/, filter/, ranker/, set-ranker/, loop.json, loop-{hotpotqa,2wikimqa,musique}.json"
