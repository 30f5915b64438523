#!/usr/bin/env bash
# Issue 43: does more training data buy measured tau at the hour's steps? The mixed hour of
# experiments/smollm2_sampled_regen (the bf16 900-s recipe: feature noise, vanilla Markov head, bf16-mixed; 5,510 steps
# on the 1,284 conversations with their greedy and sampled replies) trained again for the same steps with the 1,716
# shipped greedy conversations it never saw added (1,285-3,000, assets/smollm2/regenerated-more/train-00001.jsonl):
# 4,284 replies to 3,000 prompts instead of 2,568 to 1,284. And the 3,000 greedy replies alone, beside the greedy
# hour's 1,284. Equal steps are equal seconds (packed 1,024-token rows); budget.json records each fit's. From the
# repository root:
#   bash experiments/smollm2_more_data/run.sh cache           # the 1,285-3,000 and sampled caches (45 + 12 min, one core)
#   bash experiments/smollm2_more_data/run.sh train mixed     # combined_bf16_more_long, the mixed hour's step count
#   bash experiments/smollm2_more_data/run.sh train greedy    # combined_bf16_greedy3000_long: the 3,000 greedy only
#   bash experiments/smollm2_more_data/run.sh measure NAME    # measured tau, 32 prompts per set, bf16
#   bash experiments/smollm2_more_data/run.sh time NAME       # against bf16 generate, 16 prompts per set
#   bash experiments/smollm2_more_data/run.sh measure_t NAME  # measured tau sampling at T=0.7, 32 prompts per set
#   bash experiments/smollm2_more_data/run.sh report          # results.json / .csv / tables here, temperature_0.7/
# NAME: combined_bf16_more_long | combined_bf16_greedy3000_long. MIXED_LONG: the base (default
# study/smollm2_sampled_regen/combined_bf16_mixed_long: `bash experiments/smollm2_sampled_regen/run.sh train
# mixed_long`, then `measure` there). The stages, the budget probe and resuming are
# experiments/smollm2_recipe_choices/run.sh's. One torch thread per stage: the two runs side by side on the 2 cores.
set -euo pipefail
STUDY=experiments/smollm2_recipe_choices/run.sh
MIXED_LONG=${MIXED_LONG:-study/smollm2_sampled_regen/combined_bf16_mixed_long}
GREEDY_LONG=${GREEDY_LONG:-study/smollm2_bf16/combined_bf16_long}   # the greedy hour, the mixed hour's own base
GREEDY_3000="cache/smollm2_951/train,cache/smollm2_952_1284/train,cache/smollm2_1285_3000/train"  # greedy replies
SAMPLED=cache/smollm2_sampled/train   # the sampled replies to the first 1,284 (experiments/smollm2_sampled_regen)
export STUDY_OUT=${STUDY_OUT:-study/smollm2_more_data} DTYPE=bfloat16 PRECISION=bf16-mixed BUDGET_S=3600
export TIME_PROMPTS=${TIME_PROMPTS:-16} PROMPTS=${PROMPTS:-32} COMBINED="feature_noise vanilla"
T=${T:-0.7}   # measure_t: the sampling temperature of the second measurement
case "${1:?stage: cache | train mixed|greedy | measure NAME | time NAME | measure_t NAME | report}" in
  cache)
    bash experiments/smollm2_cpu_hour_study/run.sh caches
    bash experiments/smollm2_sampled_regen/run.sh cache ;;
  train)
    [ -f "$MIXED_LONG/budget.json" ] || { echo "$MIXED_LONG/budget.json does not exist: train it first" >&2; exit 2; }
    steps=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$MIXED_LONG/budget.json")
    case "${2:?train mixed|greedy}" in
      mixed) STEPS=$steps DATA="[$GREEDY_3000,$SAMPLED]" bash $STUDY train combined_bf16_more_long ;;
      greedy) STEPS=$steps DATA="[$GREEDY_3000]" bash $STUDY train combined_bf16_greedy3000_long ;;  # no sampled replies
      *) echo "unknown run $2 (mixed | greedy)" >&2; exit 2 ;;
    esac ;;
  measure|time|measure_t) T=$T bash $STUDY "$1" "${2:?$1 NAME}" ;;
  report)  # the mixed hour (the base) and the greedy hour (the 3,000 greedy run's base) join, linked, same prompts
    bash $STUDY link "$MIXED_LONG" "$GREEDY_LONG"
    T=$T bash $STUDY report_into experiments/smollm2_more_data "$(basename "$MIXED_LONG")" \
      "combined_bf16_greedy3000_long=$(basename "$GREEDY_LONG")" ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
