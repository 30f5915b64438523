#!/usr/bin/env bash
# Issue 43 on a CPU with a bf16 matmul path (AMX-BF16 or AVX512-BF16): the recipe study's best drafter (feature noise,
# vanilla Markov head, the head vLLM's DSpark serves) trained for the same wall-clock budget in fp32 and in bf16-mixed,
# then measured and timed with the target in bf16 against the target's own bf16 `generate` on the same (default)
# kernels. Run from the repository root, with the project's venv on PATH:
#   bash experiments/smollm2_bf16/run.sh train fp32|bf16|gated_bf16   # 900 s of training each (BUDGET_S)
#   bash experiments/smollm2_bf16/run.sh train long_bf16               # the bf16 vanilla recipe for 3,600 s (LONG_S)
#   bash experiments/smollm2_bf16/run.sh train long_gated_bf16         # the same with the gated head, beside it
#   bash experiments/smollm2_bf16/run.sh measure NAME                  # measured tau, 32 prompts per set, bf16
#   bash experiments/smollm2_bf16/run.sh time NAME                     # against bf16 generate, 16 prompts per set
#   bash experiments/smollm2_bf16/run.sh report                        # results.json / .csv / tables here
# NAME: combined_fp32 | combined_bf16 | combined_gated_bf16 | combined_bf16_long | combined_gated_bf16_long. The stages are those of
# experiments/smollm2_recipe_choices/run.sh (the budget probe, resuming from the last checkpoint, the decode JSON); this
# file only fixes what differs: the precision of each fit, bf16 decoding, the study directory.
# Needs what that study needs (targets/smollm2-135m-instruct, cache/smollm2_951/train, cache/smollm2_952_1284/train,
# cache/smollm2/validation). One torch thread per stage: two stages side by side on the 2 cores.
set -euo pipefail
STUDY=experiments/smollm2_recipe_choices/run.sh
export STUDY_OUT=${STUDY_OUT:-study/smollm2_bf16} BUDGET_S=${BUDGET_S:-900} DTYPE=bfloat16
export TIME_PROMPTS=${TIME_PROMPTS:-16} PROMPTS=${PROMPTS:-32}
case "${1:?stage: train fp32|bf16|gated_bf16|long_bf16|long_gated_bf16 | measure NAME | time NAME | report}" in
  train)
    case "${2:?train fp32|bf16|gated_bf16|long_bf16|long_gated_bf16}" in
      fp32) PRECISION=32-true COMBINED="feature_noise vanilla" bash $STUDY train combined_fp32 ;;
      bf16) PRECISION=bf16-mixed COMBINED="feature_noise vanilla" bash $STUDY train combined_bf16 ;;
      gated_bf16) PRECISION=bf16-mixed COMBINED="feature_noise" bash $STUDY train combined_gated_bf16 ;;
      # the vanilla bf16 recipe for LONG_S seconds (default 3,600): what four times the budget buys
      long_bf16) BUDGET_S=${LONG_S:-3600} PRECISION=bf16-mixed COMBINED="feature_noise vanilla" \
        bash $STUDY train combined_bf16_long ;;
      # the gated head (not served by vLLM's DSpark today) for the same LONG_S seconds, measured on the same prompts
      long_gated_bf16) BUDGET_S=${LONG_S:-3600} PRECISION=bf16-mixed COMBINED="feature_noise" \
        bash $STUDY train combined_gated_bf16_long ;;
      *) echo "unknown run $2 (fp32 | bf16 | gated_bf16 | long_bf16 | long_gated_bf16)" >&2; exit 2 ;;
    esac ;;
  measure|time) bash $STUDY "$1" "${2:?$1 NAME}" ;;
  report) python experiments/smollm2_recipe_choices/report.py --study_dir "$STUDY_OUT" --output experiments/smollm2_bf16 \
      --base combined_fp32 ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
