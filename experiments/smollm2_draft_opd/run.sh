#!/usr/bin/env bash
# Issue 43's Draft-OPD-style stage on SmolLM2-135M-Instruct: the vanilla bf16 drafter trained an hour
# (experiments/smollm2_bf16, combined_bf16_long) continues for STAGE_S seconds two ways, each from the same weights with
# a fresh AdamW at STAGE_LR (40 warm-up steps, then cosine): on the text as before (combined_stage_sft) and on
# draft-induced states (combined_stage_opd: configs/recipe_choices/draft_opd.yaml, error-position replay and the Markov head on
# its own choices). Then both are measured on the same prompts and paired. Run from the repository root:
#   bash experiments/smollm2_draft_opd/run.sh train sft|opd      # STAGE_S (900) seconds of training each
#   bash experiments/smollm2_draft_opd/run.sh train opd_equal_steps   # the OPD stage for the SFT stage's steps
#   bash experiments/smollm2_draft_opd/run.sh measure NAME        # measured tau, 32 prompts per set, bf16
#   bash experiments/smollm2_draft_opd/run.sh time NAME           # against bf16 generate, 16 prompts per set
#   bash experiments/smollm2_draft_opd/run.sh report              # results.json / .csv / tables here, the start included
# NAME: combined_stage_sft | combined_stage_opd | combined_stage_opd_equal_steps. FROM: the checkpoint both stages start from (default: the bf16 study's
# hour-long run, `bash experiments/smollm2_bf16/run.sh train long_bf16`). The stages, the budget probe and resuming are
# experiments/smollm2_recipe_choices/run.sh's. One torch thread per stage: two stages side by side on the 2 cores.
set -euo pipefail
STUDY=experiments/smollm2_recipe_choices/run.sh
FROM=${FROM:-study/smollm2_bf16/combined_bf16_long/step=5510.ckpt}
export STUDY_OUT=${STUDY_OUT:-study/smollm2_draft_opd} BUDGET_S=${STAGE_S:-900} DTYPE=bfloat16 PRECISION=bf16-mixed
export TIME_PROMPTS=${TIME_PROMPTS:-16} PROMPTS=${PROMPTS:-32}
export FIT_ARGS="--model.training.init_weights $FROM --model.optimizer.init_args.lr ${STAGE_LR:-0.0003}"
case "${1:?stage: train sft|opd|opd_equal_steps | measure NAME | time NAME | report}" in
  train)
    [ -f "$FROM" ] || { echo "FROM $FROM does not exist: train it first (experiments/smollm2_bf16/run.sh)" >&2; exit 2; }
    case "${2:?train sft|opd|opd_equal_steps}" in
      sft) COMBINED="feature_noise vanilla" bash $STUDY train combined_stage_sft ;;
      opd) COMBINED="feature_noise vanilla draft_opd" bash $STUDY train combined_stage_opd ;;
      # the same stage at the SFT stage's step count (not its seconds): what the probe's cost hides
      opd_equal_steps) STEPS=$(python -c "import json; print(json.load(open('$STUDY_OUT/combined_stage_sft/budget.json'))['steps'])") \
        COMBINED="feature_noise vanilla draft_opd" bash $STUDY train combined_stage_opd_equal_steps ;;
      *) echo "unknown run $2 (sft | opd | opd_equal_steps)" >&2; exit 2 ;;
    esac ;;
  measure|time) bash $STUDY "$1" "${2:?$1 NAME}" ;;
  report)  # the start joins the table (linked here, measured on the same prompts), paired with the SFT stage like the rest
    bash $STUDY link "$(dirname "$FROM")"
    python experiments/smollm2_recipe_choices/report.py --study_dir "$STUDY_OUT" --output experiments/smollm2_draft_opd \
      --base combined_stage_sft ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
