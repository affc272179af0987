#!/usr/bin/env bash
# The recommended EfficientRAG system from the real data, every model and loop config the shipped
# effrag/pretrained/efficientrag-all holds, in the stages the shipped files went through:
#   bash scripts/train_efficientrag.sh all           # the three train sets pooled -> checkpoints/efficientrag-all
#   bash scripts/train_efficientrag.sh hotpotqa      # one train set -> checkpoints/efficientrag-hotpotqa
# Writes the system folder checkpoints/efficientrag-<name>/: labeler/, filter/, ranker/ (the distilled student),
# ranker-teacher/ (the 6-layer teacher), ranker-late/ (the late-interaction ranker with its codec), set-ranker/,
# loop-<dataset>.json for hotpotqa, 2wikimqa and musique (chosen on that dev file), loop.json (one config chosen
# jointly on the three: the default for a corpus of your own) and README.md (its card). Then the int8 package folder
# as it would ship (EXPORT, default runs/export/efficientrag-<name>) and, beside the recipe's stage times
# (runs/recipe/<name>-stages.tsv), a comparison with the shipped system (<system folder>/versus-shipped.md).
#
# 1. Annotation-derived synthesis (no LLM; `effrag synthesize --source llm --llm SPEC` for the paper's path) of the
#    train file(s), with NEG_PER_QUERY (default 3) dense hard negatives per query for the Labeler's tag; dev files
#    are synthesised too (validation during training).
# 2. Labeler and Filter training with configs/{labeler,filter}.yaml on every synthesised record.
# 3. The pool ranker: `effrag ranker-data` (each gold chunk of the synthesised records against 7 hybrid negatives of
#    the same query) and configs/ranker.yaml train the teacher (6 layers, ranker-teacher/); `effrag ranker-teacher`
#    scores its groups with it and configs/ranker_distilled.yaml trains ranker/ from its first 2 layers on those
#    scores; the last checkpoints are installed (no dev question chooses them).
# 4. The loop structures and cost points: scripts/tune_efficientrag.py on each dev file (the grid of
#    effrag/configs/efficientrag_recipe.yaml, or TUNE_GRID) over a hybrid whose dense leg is STRUCT_ENCODER (default
#    minilm, as the shipped structures were chosen), the teacher's rows too (efficientrag_recipe_teacher.yaml), then
#    scripts/efficientrag_report.py chooses per dataset and jointly on every dev question but the bundled sample's
#    (STRUCT_RULE, default cheapest: the cheapest cost point that keeps the strongest Direct-R + one standard error;
#    STRUCT_PREFER, default simple: the simplest pool weights within one standard error), 5-fold cross-fitted.
# 5. The rankers again, where they read (LOOP_DISTILL=0 skips it): `effrag ranker-data --from-loop` makes one group
#    of each search the loop of step 4 (loop.json) makes over the train questions, the teacher scores them,
#    configs/ranker_distilled_loop.yaml trains the student one more epoch on them (installed over ranker/),
#    configs/late_ranker.yaml trains the late-interaction ranker on the same groups (ranker-late/: a chunk is read
#    once, at index time), `effrag ranker-codec` fits its vectors' codec on the train passages (64-byte codes), and
#    step 4 runs again with the student's, the teacher's and the late ranker's rows.
# 6. Export (EXPORT=DIR; EXPORT=effrag/pretrained/efficientrag-all replaces the shipped system): the encoders as int8
#    rows, as they ship; the last stages tune and train on these int8 weights, as the shipped configs were.
# 7. The pool weights over the shipped first stage: each dev file's loop-<dataset>.json and loop.json, over a hybrid
#    whose dense leg is ENCODER (default e5-small), every combination of effrag/configs/efficientrag_weights.yaml;
#    efficientrag_report.py then picks by RULE (default best: the best mean recall at 7 and 10 chunks), PREFER
#    (default recall) and FALL_BACK (default 1: a dataset ships loop.json's config where its own pick does not beat
#    it cross-fitted), into the exported folder's loop*.json and card.
# 8. The set-wise pool ranker (SET_RANKER=0 skips it): scripts/train_set_ranker.sh trains set-ranker/ on the train
#    questions' pools and writes into each loop config whether the shipping rule picks it (set_ranker_top).
# 9. The exported folder drops the rankers no final config reads (export_pretrained.py --prune), the final loop
#    configs and set-ranker/ are copied back into the system folder, and scripts/compare_systems.py
#    compares the exported folder with the shipped one: the same picks, and every cross-fitted recall within 1 point.
# Every stage resumes; finished stages are reused.
# Env: DATA (default ../shared/data), PROCESSES (CPU processes, default 1), BIN (default .venv/bin), LAUNCH (raw
# `accelerate launch` arguments for GPUs, e.g. LAUNCH="--multi_gpu --num_processes 4"), RETRIEVER (the loop's
# retriever, default hybrid), ENCODER (its dense leg's encoder, default e5-small; the loop configs name it),
# STRUCT_ENCODER (steps 4-5, default minilm), NEG_PER_QUERY, CONTEXT_NEG, TUNE_GRID, FOLDS (default 5), RULE, MARGIN
# (points, or se: one standard error, the default), PREFER, FALL_BACK (1 or 0), STRUCT_RULE, STRUCT_PREFER,
# LOOP_DISTILL (0: no step 5), SET_RANKER (0: no step 8), EXPORT, NAME (checkpoint name, default the dataset),
# LABELER_ARGS (Labeler-only overrides), RANKER_ARGS (ranker-only overrides), REPORT_ARGS (extra arguments of every
# efficientrag_report.py call), KEEP_SAMPLE (1: the bundled sample's dev questions choose too, for a run whose DATA
# is the bundled sample: the recipe's smoke run, reports/efficientrag/recipe), TUNE_ONLY=DIR (no synthesis,
# training or export: tune the system DIR and write DIR/loop*.json; NAME=int8
# TUNE_ONLY=effrag/pretrained/efficientrag-all retunes the package's int8 copy). Extra args after the dataset go to
# the Labeler and Filter trainings, e.g. `... all --train.epochs 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
ds=${1:?usage: scripts/train_efficientrag.sh <hotpotqa|2wikimqa|musique|all> [train overrides]}
shift
DATA=${DATA:-../shared/data}
BIN=${BIN:-.venv/bin}
RETRIEVER=${RETRIEVER:-hybrid}
ENCODER=${ENCODER:-e5-small}
STRUCT_ENCODER=${STRUCT_ENCODER:-minilm}
FOLDS=${FOLDS:-5}
NEG=${NEG_PER_QUERY:-3}
CTX=${CONTEXT_NEG:-0}
read -ra report_args <<< "${REPORT_ARGS:-}"
[ "${KEEP_SAMPLE:-0}" = 1 ] && report_args+=(--keep-sample)  # DATA is the bundled sample: its questions choose
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
# each stage's wall time, appended to runs/recipe/<name>-stages.tsv (a stage that reuses a finished one is short)
mkdir -p runs/recipe
stage_log="runs/recipe/$name-stages.tsv"
printf '# %s commit %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$*" >> "$stage_log"
stage_name="" stage_t0=$SECONDS
stage() {  # $1: the next stage's name ("" ends the last)
  [ -z "$stage_name" ] || printf '%s\t%d\n' "$stage_name" $((SECONDS - stage_t0)) >> "$stage_log"
  stage_name=$1 stage_t0=$SECONDS
  [ -z "$1" ] || echo "== $(date +%H:%M:%S) $1" >&2
}
if [ -z "${TUNE_ONLY:-}" ]; then
stage "1 synthesis"
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
stage "2 labeler and filter"
"$BIN/python" scripts/train_models.py --name "$name" --synth "$synth" --processes "${PROCESSES:-1}" \
  ${LAUNCH:+--launch-args "$LAUNCH"} --labeler-overrides "${LABELER_ARGS:-}" -- --data.max_train_examples 100000 "$@"
stage "3 ranker teacher and student"
# shellcheck disable=SC2086
"$BIN/python" scripts/train_models.py --models ranker --name "$name" --ranker-data "runs/ranker/train_$ds" \
  --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"} -- ${RANKER_ARGS:-}
"$BIN/effrag" ranker-teacher --data "runs/ranker/train_$ds" --teacher "checkpoints/efficientrag-$name/ranker-teacher" \
  --output "runs/ranker/train_${ds}_teacher" --bf16
"$BIN/python" scripts/train_models.py --models ranker_distilled --name "$name" \
  --teacher-data "runs/ranker/train_${ds}_teacher" --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"}
fi
tune_and_report() {  # steps 4-5: $1, the student's tune folders' suffix; the teacher's rows are shared by both rounds
  local d tunes=()
  for d in hotpotqa 2wikimqa musique; do  # every dev question's result is kept: the report cross-fits them
    # shellcheck disable=SC2086
    "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" --ranker "$ck/ranker" \
      --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" --retriever "$RETRIEVER" \
      --encoder "$STRUCT_ENCODER" --bf16 --er-bf16 --n 0 "${grid_args[@]}" --output "runs/tune/$name-$d$1" > /dev/null
    tunes+=("$d=runs/tune/$name-$d$1")
    if [ -d "$ck/ranker-teacher" ]; then  # the teacher's rows too: the report chooses among both rankers' configs
      "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
        --ranker "$ck/ranker-teacher" --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" \
        --retriever "$RETRIEVER" --encoder "$STRUCT_ENCODER" --bf16 --er-bf16 --n 0 \
        --grid-file effrag/configs/efficientrag_recipe_teacher.yaml --output "runs/tune/$name-$d-teacher" > /dev/null
      tunes+=("$d=runs/tune/$name-$d-teacher@ranker-teacher")
    fi
    if [ -d "$ck/ranker-late" ]; then  # and the late-interaction ranker's (step 5): reads that cost no forward
      "$BIN/python" scripts/tune_efficientrag.py --labeler "$ck/labeler" --filter "$ck/filter" \
        --ranker "$ck/ranker-late" --questions "$DATA/$d/dev.jsonl" --corpus-from "$DATA/$d/train.jsonl" \
        --retriever "$RETRIEVER" --encoder "$STRUCT_ENCODER" --bf16 --er-bf16 --n 0 "${grid_args[@]}" \
        --output "runs/tune/$name-$d-late" > /dev/null
      tunes+=("$d=runs/tune/$name-$d-late@ranker-late")
    fi
  done
  # the bar: the strongest of BM25, dense and hybrid with MiniLM and with the structures' encoder
  local encoders=(minilm)
  [ "$STRUCT_ENCODER" = minilm ] || encoders+=("$STRUCT_ENCODER")
  "$BIN/python" scripts/efficientrag_report.py --tune "${tunes[@]}" --data "$DATA" --folds "$FOLDS" --system "$ck" \
    --encoders "${encoders[@]}" --rule "${STRUCT_RULE:-cheapest}" --margin "${MARGIN:-se}" \
    --prefer "${STRUCT_PREFER:-simple}" --output "runs/tune/$name-report$1" "${report_args[@]}"
}
stage "4 loop structures"
tune_and_report ""
if [ -z "${TUNE_ONLY:-}" ] && [ "${LOOP_DISTILL:-1}" != 0 ]; then
  # 5. the student again, where it reads: the tuned loop's own searches over the train questions, scored by the
  # teacher, one more epoch (configs/ranker_distilled_loop.yaml, installed over ranker/), its rows tuned and chosen
  stage "5 rankers on the loop's searches"
  "$BIN/effrag" ranker-data --from-loop "$ck" --inputs "${inputs[@]}" --output "runs/ranker/train_${ds}_loop" \
    --depth 20 --batch-size 32
  "$BIN/effrag" ranker-teacher --data "runs/ranker/train_${ds}_loop" --teacher "$ck/ranker-teacher" \
    --output "runs/ranker/train_${ds}_loop_teacher" --bf16
  "$BIN/python" scripts/train_models.py --models ranker_distilled_loop,late_ranker --name "$name" \
    --teacher-data "runs/ranker/train_${ds}_loop_teacher" --processes "${PROCESSES:-1}" ${LAUNCH:+--launch-args "$LAUNCH"}
  # the late ranker's codec (issue #68): its chunk vectors stored as product-quantised codes, fitted on the train
  # files' passages, before its rows are tuned (the loop reads the codes, so the tuning does too)
  "$BIN/effrag" ranker-codec --model "$ck/ranker-late" --inputs "${inputs[@]}"
  stage "5 loop structures with every ranker"
  tune_and_report "-loop"
fi
# 6. the int8 package folder (what ships); the stages below tune and train on its weights
sys=$ck
if [ -z "${TUNE_ONLY:-}" ]; then
  stage "6 export"
  sys=${EXPORT:-runs/export/efficientrag-$name}
  "$BIN/python" scripts/export_pretrained.py --src "$ck" --dst "$sys"
fi
source scripts/recipe_lib.sh  # same_config, ranker_of
stage "7 pool weights over $ENCODER"
weights=() encoders=(minilm)
[ "$ENCODER" = minilm ] || encoders+=("$ENCODER")
for d in hotpotqa 2wikimqa musique; do
  cfgs=(general)
  same_config "$sys/loop-$d.json" "$sys/loop.json" || cfgs=(own general)
  for c in "${cfgs[@]}"; do
    f="$sys/loop-$d.json"
    [ "$c" = general ] && f="$sys/loop.json"
    "$BIN/python" scripts/tune_efficientrag.py --model "$sys" --er-config "$f" \
      --grid-file effrag/configs/efficientrag_weights.yaml --questions "$DATA/$d/dev.jsonl" \
      --corpus-from "$DATA/$d/train.jsonl" --retriever "$RETRIEVER" --encoder "$ENCODER" --bf16 --er-bf16 --n 0 \
      --output "runs/tune/$name-weights-$c-$d" > /dev/null
    weights+=("$d=runs/tune/$name-weights-$c-$d@$(ranker_of "$f")")
  done
done
over="a $RETRIEVER retriever with $ENCODER: the pool weights and this file's pick among the structures; the structures and cost points over $STRUCT_ENCODER (scripts/train_efficientrag.sh steps 4-5)"
"$BIN/python" scripts/efficientrag_report.py --tune "${weights[@]}" --data "$DATA" --folds "$FOLDS" --system "$sys" \
  --encoders "${encoders[@]}" --rule "${RULE:-best}" --margin "${MARGIN:-se}" --prefer "${PREFER:-recall}" \
  $([ "${FALL_BACK:-1}" = 0 ] || echo --fall-back) --over "$over" --output "runs/tune/$name-report-weights" \
  "${report_args[@]}"
if [ "${SET_RANKER:-1}" != 0 ]; then
  # 8. the set-wise pool ranker (issue #70): trained on the train questions' pools under the loop configs just
  # written, shipped into a loop config only where the shipping rule picks it (scripts/train_set_ranker.sh)
  stage "8 set ranker"
  train_sets=("$ds")
  [ "$ds" = all ] && train_sets=(hotpotqa 2wikimqa musique)
  DATA="$DATA" BIN="$BIN" RETRIEVER="$RETRIEVER" ENCODER="$ENCODER" OUT="runs/set-ranker/$name" \
    KEEP_SAMPLE="${KEEP_SAMPLE:-0}" bash scripts/train_set_ranker.sh "$sys" "${train_sets[@]}"
fi
if [ "$sys" != "$ck" ]; then
  # 9. the system folder holds what ships: its loop configs and set-ranker/, then the comparison with the package's
  stage "9 copy back and compare"
  "$BIN/python" scripts/export_pretrained.py --prune --dst "$sys"   # rankers no final config reads (the teacher)
  cp "$sys"/loop*.json "$ck"/
  if [ -d "$sys/set-ranker" ]; then rm -rf "$ck/set-ranker"; cp -r "$sys/set-ranker" "$ck/set-ranker"; fi
  "$BIN/python" scripts/compare_systems.py "$sys" effrag/pretrained/efficientrag-all --output "$ck/versus-shipped.md"
fi
stage ""
echo "EfficientRAG system in $ck (labeler/, filter/, ranker/, ranker-teacher/, ranker-late/, set-ranker/, loop*.json); int8 as it ships: $sys; stage times: $stage_log"
