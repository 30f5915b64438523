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
# # 02 · Markov heads: none, vanilla, gated, rnn
#
# The DFlash backbone drafts all `B` slots of a block in **one parallel pass**, so the token it puts in slot `k` cannot
# depend on the token it put in slot `k-1`. When the block could continue in two ways ("`import os`" vs
# "`from os import`"), the slots can disagree with each other and the block gets rejected early. A **Markov head** adds
# the missing dependency as a cheap low-rank logit bias from the previous token `a` of the block:
#
# | head | bias added to the base logits `U_k` | extra cost |
# |---|---|---|
# | `none` | 0 (pure DFlash) | - |
# | `vanilla` | `W2ᵀ W1[a]` - a rank-`r` bigram table | one row gather + `r x Vd` |
# | `gated` | `W2ᵀ (W1[a] ⊙ σ(Wg [h_k ; W1[a]] + b))` - the bigram gated by the draft hidden state | + one `(H+r) x r` gate |
# | `rnn` | `W2ᵀ tanh(out)`, with a state `s` carried across the block | + one `(2r+H) x 3r` cell; path dependent |
#
# In training the previous token is the ground truth (teacher forcing); when drafting it is the token drafted in the
# slot before, so decoding becomes sequential over the `B` slots (cheap: `B` small matrix products; tutorial 03 shows
# how the Selector makes even that parallel for `vanilla` and `gated`).
#
# Here we train all four on **the same budget** (same seed, same data order, 200 steps of 4 x 128 tokens) and compare
# their per-slot acceptance. Each head is just another YAML in `configs/heads/`, composed after the quickstart config:
# `dspark-lightning fit --config configs/quickstart.yaml --config configs/heads/gated.yaml`.

# %%
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch

from dspark_lightning import plotting
from dspark_lightning.cli import cli_main
from dspark_lightning.measuring.tables import measured_decoding
from dspark_lightning.shipped import SHIPPED_ROOT as REPO  # the shipped configs/ and assets/ (a checkout or a wheel)
from dspark_lightning.studies.command_lines import shell_command
from dspark_lightning.studies.quiet_output import quiet_logs
from dspark_lightning.studies.runs import demo_fit_args

torch.set_num_threads(1)
quiet_logs()  # Lightning info lines and known harmless warnings off
# %matplotlib inline
WORK = Path(os.environ.get("DSPARK_TUTORIAL_DIR") or tempfile.mkdtemp(prefix="dspark-tutorial-"))
HEADS = ["none", "vanilla", "gated", "rnn"]
# every fit's training steps and the validation prompts each decoding demo runs; the notebook tests set a few of each
# (they check that the tutorial runs and its decoders agree, not what it learns)
STEPS = int(os.environ.get("DSPARK_TUTORIAL_STEPS", "200"))
PROMPTS = int(os.environ.get("DSPARK_TUTORIAL_PROMPTS", "8"))

# %% [markdown]
# `demo_fit_args` (from `dspark_lightning.studies.runs`, shared with `dspark-lightning report`) builds the same kind of
# argument list as tutorial 01: the quickstart config, one head config, and overrides for a CPU budget. This is what
# it passes for the gated head:

# %%
print((REPO / "configs/heads/gated.yaml").read_text())
print(shell_command(["fit", *demo_fit_args(WORK, head="gated", steps=STEPS, eval_prompts=PROMPTS)]))

# %% [markdown]
# ## Train the four variants
#
# After each fit we keep the last validation (teacher-forced, on the same validation blocks for every head), count
# the head's parameters, and measure real greedy speculative decoding with the target on 8 validation prompts
# (`markov` mode; `parallel` for the head-less drafter).

# %%
results, per_slot, greedy_per_slot, logs = {}, {}, {}, {}
for head in HEADS:
    start = time.perf_counter()
    cli = cli_main(["fit", *demo_fit_args(WORK, head=head, steps=STEPS, eval_prompts=PROMPTS)])
    seconds = time.perf_counter() - start
    module, values = cli.model, cli.model.last_validation
    mode = "parallel" if module.drafter.markov_head is None else "markov"
    decoded = measured_decoding(module, cli.datamodule.eval_prompts(), [mode], max_new_tokens=64, k=16)[mode]
    head_module = module.drafter.markov_head
    results[head] = {
        "head parameters": 0 if head_module is None else sum(p.numel() for p in head_module.parameters()),
        "fit seconds": round(seconds, 1),
        "teacher-forced tau": round(float(values["acceptance/tau"]), 3),
        "teacher-forced greedy tau": round(float(values["acceptance/greedy_tau"]), 3),
        "measured tau": round(decoded.tau, 3),
        "measured in mode": mode,
    }
    per_slot[head] = values["acceptance/accept_rate_per_slot"]
    greedy_per_slot[head] = values["acceptance/greedy_acc_per_slot"]
    logs[head] = pd.read_csv(Path(cli.trainer.log_dir) / "metrics.csv")
    print(f"{head:8s} {seconds:5.1f} s   teacher-forced tau {results[head]['teacher-forced tau']:.3f}")

pd.DataFrame(results).T.round(3)

# %% [markdown]
# ## Per-slot acceptance, side by side
#
# Slot 0 is predicted right after the last real token, so every variant is best there. The Markov heads matter from
# slot 1 on, where the backbone alone only sees MASK tokens: the bias from the previous token keeps the later slots
# consistent with the earlier ones. (`accept_rate` is the expected acceptance under speculative sampling, `greedy_acc`
# the fraction of slots whose argmax equals the target's.)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for ax, (title, curves) in zip(axes, [("accept_rate", per_slot), ("greedy_acc", greedy_per_slot)]):
    for head, values in curves.items():
        ax.plot(range(len(values)), values.tolist(), marker="o", label=head)
    ax.set(title=f"{title} per slot, {STEPS} steps", xlabel="draft slot k", ylim=(0, None))
    ax.grid(alpha=0.3)
axes[0].legend()
axes[0].set_ylabel("rate")
fig.tight_layout()

# %% [markdown]
# The training curves (logged every 10 steps to each run's `metrics.csv`) show how fast each head learns:

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for head, log in logs.items():
    train = log[["step", "train/loss", "train/tau"]].dropna()
    axes[0].plot(train["step"], train["train/loss"], label=head)
    axes[1].plot(train["step"], train["train/tau"], label=head)
axes[0].set(title="training loss", xlabel="step")
axes[1].set(title="training tau (sampled blocks)", xlabel="step")
for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()

# %% [markdown]
# ## Reading the numbers
#
# - 200 CPU steps on a 1M-parameter target is a *tiny* budget and a single seed: differences of a few hundredths in
#   tau are noise. The full comparison with 3x the steps and both block sizes is one command:
#   `dspark-lightning report --output experiments/demo_heads` (its numbers are in the README).
# - **Teacher-forced vs measured tau.** Teacher-forced numbers score every slot given the *true* previous tokens;
#   real decoding conditions on the drafter's own earlier guesses and on the target's own continuation, so it is the
#   number that predicts the speed-up. Watch the gap between the two when you change heads or data.
# - The `rnn` head carries a state through the whole block, so it can model longer dependencies, but it has no
#   parallel (Selector) form and its bias must be computed slot by slot at inference; `vanilla` and `gated` run as a
#   Selector (next tutorial).
# - `plotting.per_slot_chart` draws the same kind of chart from any dict of curves:

# %%
fig = plotting.per_slot_chart(per_slot, title="accept_rate per slot (plotting.per_slot_chart)")
