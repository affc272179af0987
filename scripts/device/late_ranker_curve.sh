#!/usr/bin/env bash
# The late ranker's training curve on a lent GPU (run there, from the repository root, with .gpu carried: see
# late_ranker_curve.py). The shipped recipe, configs/late_ranker.yaml, one process of 4 groups a step (the shipped
# run: 2 processes of 2), from the packed MiniLM; each run's dev-group figures go to $OUT/summary.txt, the 2-epoch
# run's weights to $OUT. Runs that would outlast BUDGET seconds (default 500) from the start are cut or skipped.
set -u
START=$(date +%s); BUDGET=${BUDGET:-500}; W=runs/device-curve
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $W/runs
for f in .gpu/data/*.jsonl.gz; do b=$(basename $f .jsonl.gz); mkdir -p $W/$b; gunzip -c $f > $W/$b/ranker.jsonl; done
nvidia-smi -L
python3 -c 'import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__)'
run() {  # name, seconds, overrides...
  n=$1; t=$2; shift 2; s=$(date +%s); left=$((START + BUDGET - s)); [ $left -lt $t ] && t=$left
  [ $t -lt 20 ] && { echo "$n skipped"; return; }
  timeout $t python3 scripts/device/late_ranker_curve.py train --config configs/late_ranker.yaml \
    --model.name_or_path .gpu/minilm --data.train_file $W/train_all_loop_teacher/ranker.jsonl \
    --data.eval_files "[$W/dev_hotpotqa/ranker.jsonl, $W/dev_2wikimqa/ranker.jsonl, $W/dev_musique/ranker.jsonl]" \
    --train.batch_size 4 --train.torch_threads null --train.save_every 0 --train.log_every 50 \
    --train.output_dir $W/runs/$n "$@" > $W/runs/$n.log 2>&1
  rc=$?; cat $W/runs/$n.log >> $OUT/all.log; echo "$n rc=$rc $(( $(date +%s) - s ))s"; tail -2 $W/runs/$n.log
  python3 -c "import json; r = json.load(open('$W/runs/$n/results.json')); e = r['eval']; print('$n', r['train_examples'], r['global_step'], r['train_time_s'], {k: round(v, 4) for k, v in e.items() if k.endswith(('mrr', 'top1'))})" >> $OUT/summary.txt 2>&1
}
run e2 230 --train.epochs 2
python3 scripts/device/late_ranker_curve.py extract $W/runs/e2/last $OUT e2 && cp $W/runs/e2/results.json $OUT/e2.results.json
run e06 75 --train.epochs 0.6
run f50 75 --train.epochs 2 --data.max_train_examples 1220
run f25 55 --train.epochs 2 --data.max_train_examples 610
run e4 200 --train.epochs 4
cat $OUT/summary.txt
