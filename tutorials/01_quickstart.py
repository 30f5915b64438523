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
# # 01 · Quickstart: train a DSpark drafter and read its numbers
#
# In this tutorial you train a small **DSpark drafter** for the demo target that ships in `assets/`, on the CPU, in
# well under a minute, and then look at everything a run produces: the metrics, the per-slot acceptance curve, the
# checkpoint, a real speculative-decoding measurement and the offline Weights & Biases run.
#
# **What is being trained.** Speculative decoding lets a cheap *drafter* propose a block of tokens that the big
# *target* model then verifies in one forward pass; every accepted token saves a target forward. A DSpark drafter is
#
# - a **DFlash backbone**: one (here) transformer layer that reads the frozen target's hidden states and predicts a
#   whole block of `B` tokens at once from `[last token, MASK, MASK, ...]`;
# - a **Markov head**: a rank-`r` logit bias from the previous token of the block, so slot `k` can depend on what was
#   drafted at slot `k-1` (the backbone alone cannot: it predicts all slots in parallel);
# - a **confidence head**: predicts, per slot, the probability that the target accepts it.
#
# The number everyone watches is **tau**, the expected acceptance length: how many tokens one target forward yields
# (1 = the drafter is useless, `B + 1` = every drafted token is accepted).
#
# Nothing in this notebook writes into the repository: runs go to a temporary directory.

# %%
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import torch
import yaml
from IPython.display import Image, display

from dspark_lightning import plotting
from dspark_lightning.cli import cli_main
from dspark_lightning.shipped import SHIPPED_ROOT as REPO  # the shipped configs/ and assets/ (a checkout or a wheel)
from dspark_lightning.studies.quiet_output import quiet_logs

torch.set_num_threads(1)  # tiny models: more threads only fight over the CPU
quiet_logs()  # Lightning's info lines and a few known, harmless warnings off
# %matplotlib inline
os.environ["WANDB_MODE"] = "offline"  # W&B writes a local run; no account, no network
WORK = Path(os.environ.get("DSPARK_TUTORIAL_DIR") or tempfile.mkdtemp(prefix="dspark-tutorial-"))
# every fit's training steps and the validation prompts each decoding demo runs; the notebook tests set a few of each
# (they check that the tutorial runs and its decoders agree, not what it learns)
STEPS = int(os.environ.get("DSPARK_TUTORIAL_STEPS", "300"))
PROMPTS = int(os.environ.get("DSPARK_TUTORIAL_PROMPTS", "4"))
print("configs and assets:", REPO)
print("this tutorial writes into:", WORK)

# %% [markdown]
# ## 1. The configuration
#
# Runs are configured with [LightningCLI](https://lightning.ai/docs/pytorch/stable/cli/lightning_cli.html) YAML
# files. `configs/quickstart.yaml` is the full recipe for the demo: the trainer (steps, validation, loggers,
# callbacks), the model (`DSparkModule`: target, block size, heads, loss) and the data (`ShareGPTDataModule`). Its
# `model:` section:

# %%
config = yaml.safe_load((REPO / "configs/quickstart.yaml").read_text())
print(yaml.safe_dump({"model": config["model"]}, sort_keys=False))

# %% [markdown]
# ## 2. Train
#
# `dspark-lightning fit --config configs/quickstart.yaml` trains for 400 steps (a few minutes on a laptop). From
# Python the same command is `cli_main(["fit", ...])`: it takes exactly the command-line arguments and returns the
# `LightningCLI` object, whose `.trainer`, `.model` and `.datamodule` you can use afterwards.
#
# We shrink the run with command-line overrides (they win over the YAML): shorter packed rows (`seq_len` 128), 16
# blocks per row, 300 steps, validation after 150 and 300 steps on the first 64 validation conversations. The two
# loggers (CSV, and W&B in offline mode) are pointed into our temporary directory. Everything else - the vanilla Markov
# head, the confidence head, the loss, the callbacks that draw charts and run real speculative decoding at each
# validation - comes from the YAML.

# %%
loggers = [
    {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(WORK), "name": "quickstart"}},
    {
        "class_path": "dspark_lightning.lightning.wandb.OfflineFirstWandbLogger",
        "init_args": {"save_dir": str(WORK / "quickstart"), "project": "dspark-lightning"},
    },
]
args = [
    "fit",
    "--config", str(REPO / "configs/quickstart.yaml"),
    f"--model.target.path={REPO}/assets/demo-target",  # the YAML's relative paths assume the repository as cwd
    f"--data.train_files={REPO}/assets/data/regenerated/train-*.jsonl",
    f"--data.val_files={REPO}/assets/data/sharegpt/validation-*.jsonl",
    "--data.seq_len=128",
    "--model.drafter.max_anchors=16",
    f"--trainer.max_steps={STEPS}",
    f"--trainer.val_check_interval={STEPS // 2}",
    "--trainer.limit_val_batches=8",
    "--data.limit_val_samples=64",
    f"--data.num_eval_prompts={PROMPTS}",  # the decoding callback's prompts: the first few of these
    f"--trainer.logger={json.dumps(loggers)}",
]  # fmt: skip
cli = cli_main(args)

# %% [markdown]
# ## 3. Read the metrics
#
# The trainer keeps the last logged value of every metric. `val/tau` is the expected acceptance length on
# validation blocks, computed with the target's true distribution at every slot (*teacher forcing*: the drafter sees
# the ground-truth previous tokens). `val/greedy_tau` counts slots until the drafter's argmax first differs from the
# target's argmax. `val/decode/<mode>/tau` is different: it comes from **real speculative decoding** with the target
# on a few validation prompts (the `SpeculativeDecodingCallback`), i.e. tokens per target forward actually measured.

# %%
metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
keys = ["val/tau", "val/greedy_tau", "val/accept_rate", "val/confidence/prefix_ece", "val/decode/parallel/tau",
        "val/decode/markov/tau", "val/decode/selector/tau", "val/selector/agreement@16"]  # fmt: skip
pd.Series({k: metrics[k] for k in keys if k in metrics}, name="value").round(4).to_frame()

# %% [markdown]
# Every run has its own directory: the resolved config (re-run it with `--config <run>/config.yaml`), `metrics.csv`,
# the checkpoint (only the trainable drafter weights; the target is re-loaded from `model.target.path`) and `plots/`.

# %%
run_dir = Path(cli.trainer.log_dir)
for path in sorted(run_dir.rglob("*")):
    if path.is_file():
        print(f"{path.relative_to(WORK)}  ({path.stat().st_size / 1024:.0f} KiB)")

# %% [markdown]
# `metrics.csv` has one row per logging step; training scalars every 10 steps, validation scalars at each
# validation. The training loss falls and the training tau rises:

# %%
log = pd.read_csv(run_dir / "metrics.csv")
train = log[["step", "train/loss", "train/tau"]].dropna()
val = log[["step", "val/tau"]].dropna()
fig = plotting.xy_chart(train["step"], {"train/loss": train["train/loss"]}, "training loss", "step", "loss")
fig = plotting.xy_chart(
    train["step"], {"train/tau": train["train/tau"]}, "acceptance length tau", "step", "tau (tokens per block)"
)
fig.axes[0].plot(val["step"], val["val/tau"], "s", markersize=9, label="val/tau")
fig.axes[0].legend()
display(fig)

# %% [markdown]
# ## 4. Per-slot acceptance
#
# `accept_rate` at slot `k` is the mean acceptance probability of the token drafted at slot `k`
# (`1 - TV(draft, target)`); `greedy_acc` is how often the drafter's argmax equals the target's. Later slots are
# harder: the backbone predicts them from MASK tokens, further from the last real token, which is why tau grows
# much more slowly than `B`. The `AcceptanceCurves` callback draws this chart after every validation into
# `plots/` (and W&B); here we draw it from the module's last validation values.

# %%
values = cli.model.last_validation
plotting.per_slot_chart(
    {"accept_rate": values["acceptance/accept_rate_per_slot"], "greedy_acc": values["acceptance/greedy_acc_per_slot"]},
    title=f"per-slot acceptance after {cli.trainer.global_step} steps (tau {float(values['acceptance/tau']):.2f})",
)

# %% [markdown]
# The callbacks' own PNGs, e.g. the confidence head's reliability diagram (tutorial 04 explains it):

# %%
display(Image(filename=sorted((run_dir / "plots").glob("val_confidence_reliability_*.png"))[-1]))

# %% [markdown]
# ## 5. Use the checkpoint: measured speculative decoding
#
# Every post-training tool works from the checkpoint alone. `dspark-lightning decode` (here via `cli_main`) rebuilds
# the model and data module from it and runs greedy speculative decoding on validation prompts in each draft mode:
# `parallel` (base logits only, pure DFlash), `markov` (the Markov head applied slot by slot, as trained) and
# `selector` (the top-k Selector walk, tutorial 03). Greedy speculative decoding is lossless: the output is exactly the
# target's own greedy generation, only faster.

# %%
ckpt = run_dir / "checkpoints" / "last.ckpt"
rows = cli_main(["decode", "--ckpt_path", str(ckpt), "--num_prompts", str(PROMPTS), "--max_new_tokens", "48"])

# %% [markdown]
# The same checkpoint re-validates with `dspark-lightning validate --config <run>/config.yaml --ckpt_path <ckpt>` and
# exports for vLLM with `dspark-lightning export`.
#
# ## 6. The offline W&B run
#
# The `OfflineFirstWandbLogger` writes a complete W&B run to disk (metrics, config, the chart images) without an
# account or network. Close it so every file is flushed, then look at what is there:

# %%
import wandb  # noqa: E402

wandb.finish()
wandb_dir = WORK / "quickstart" / "wandb"
offline_runs = sorted(wandb_dir.glob("offline-run-*"))
for run in offline_runs:
    print(run.relative_to(WORK))
    for path in sorted(run.rglob("*")):
        if path.is_file():
            print("   ", path.relative_to(run))

# %% [markdown]
# To upload it later (after `wandb login`), sync the directory; to log online from the start, set
# `WANDB_MODE=online` before training (`configs/logger/wandb.yaml` adds the same logger to any other config; it too
# stays offline unless `WANDB_MODE=online`):

# %%
print(f"wandb sync {offline_runs[-1]}" if offline_runs else "no offline run (WANDB_MODE=disabled?)")
print("WANDB_MODE=online dspark-lightning fit --config configs/quickstart.yaml")

# %% [markdown]
# ## Where next
#
# - **02 · Markov heads**: none vs vanilla vs gated vs rnn on the same budget.
# - **03 · The Selector**: the top-k walk that runs a Markov head in parallel, and why it is exact at `k = V`.
# - **04 · Confidence**: calibrating the confidence head and scheduling how much of a block to verify.
# - **05 · Scaling up**: real targets, W&B online, multi-GPU, the offline hidden-state cache.
# - `dspark-lightning report --output experiments/demo_heads` trains every head at two block sizes and writes a report.
