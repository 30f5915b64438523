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
# # 04 · Confidence: calibration and scheduled verification
#
# Verifying a drafted token is not free: on a GPU, verifying 16 drafted tokens costs more than verifying 4, and a
# serving engine batching many requests pays for every verified slot. The **confidence head** predicts, for every
# slot `k`, `c_k ≈ P(slot k accepted | all earlier slots accepted)`. Its training target is the analytic acceptance
# probability `α_k = Σ_v min(q_k(v), p_k(v)) = 1 - TV(q_k, p_k)` of the draft distribution `q` against the target's
# `p` (binary cross-entropy against the detached `α`; the gradient reaches the drafter through the head's inputs).
#
# What a scheduler uses is the **prefix survival** `a_n = c_0 · c_1 ··· c_n`: the probability that the first `n + 1`
# drafted tokens are all accepted. Verify only the slots with `a_n ≥ threshold`, and a block with a shaky start costs
# one verified token instead of `B`.
#
# This only works if `a_n` is **calibrated**: among blocks where it says 0.3, about 30% must survive. We measure that
# with a reliability diagram and the expected calibration error (ECE), fix it with **sequential temperature scaling**
# (one temperature per slot, fitted left to right so that each prefix product is calibrated), and then run
# confidence-scheduled speculative decoding with the target.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch

from dspark_lightning import plotting
from dspark_lightning.cli import cli_main
from dspark_lightning.decoding import speculative_generate
from dspark_lightning.measuring.calibration import heldout_calibration, prefix_quantities
from dspark_lightning.measuring.tables import decode_table
from dspark_lightning.measuring.validation_blocks import collect_blocks
from dspark_lightning.studies.quiet_output import quiet_logs
from dspark_lightning.studies.runs import demo_fit_args

torch.set_num_threads(1)
quiet_logs()  # Lightning info lines and known harmless warnings off
# %matplotlib inline
WORK = Path(os.environ.get("DSPARK_TUTORIAL_DIR") or tempfile.mkdtemp(prefix="dspark-tutorial-"))
# every fit's training steps and the validation prompts each decoding demo runs; the notebook tests set a few of each
# (they check that the tutorial runs and its decoders agree, not what it learns)
STEPS = int(os.environ.get("DSPARK_TUTORIAL_STEPS", "300"))
PROMPTS = int(os.environ.get("DSPARK_TUTORIAL_PROMPTS", "8"))

# %% [markdown]
# ## Train a drafter with a confidence head
#
# The quickstart config has one (`confidence_head: true`, reading the hidden state and the Markov head's
# previous-token embedding: `confidence_with_markov: true`). 300 steps, then the validation's confidence metrics:
# mean `c` vs mean `α`, mean `|c - α|`, the ECE of the per-slot `c_k` (`slot_ece`), the ECE of the prefix survival
# `a_n` (`prefix_ece`), and the signed bias of `a_n` against the observed prefix acceptance.

# %%
cli = cli_main(["fit", *demo_fit_args(WORK, steps=STEPS, eval_prompts=PROMPTS)])
module = cli.model
names = ["mean_confidence", "mean_alpha", "mean_abs_error", "slot_ece", "prefix_ece", "prefix_survival_bias"]
metrics = cli.trainer.callback_metrics
pd.Series({f"val/confidence/{n}": round(float(metrics[f"val/confidence/{n}"]), 4) for n in names}).to_frame("value")

# %% [markdown]
# ## Per-slot: predicted confidence vs acceptance
#
# `collect_blocks` gathers the validation blocks with the confidence logits and the acceptance `α` of every slot. On
# average per slot, the head should track `α` (the validation metrics `val/confidence/mean_confidence/slot_k` and
# `val/confidence/mean_alpha/slot_k` measure the same, over the validation's own batches):

# %%
blocks = collect_blocks(module, cli.datamodule.val_dataloader(), max_blocks=1024)
valid = blocks.valid
conf = torch.sigmoid(blocks.confidence_logits)
per_slot = {
    "mean confidence c_k": (conf * valid).sum(0) / valid.sum(0),
    "mean acceptance α_k": (blocks.alpha * valid).sum(0) / valid.sum(0),
}
print(f"{blocks.num_blocks} blocks")
fig = plotting.per_slot_chart(per_slot, title="confidence head vs acceptance, per slot")

# %% [markdown]
# ## Calibration of the prefix survival, before and after temperature scaling
#
# `heldout_calibration` fits the per-slot temperatures `T_k` (`c_k = σ(z_k / T_k)`) on half of the blocks with
# `measuring.calibration.fit_sequential_temperatures` and measures the prefix-survival ECE on the *other* half,
# before and after (fitting and scoring on the same blocks would flatter the result). The reliability diagram bins the
# predicted `a_n` and compares each bin's mean with the observed prefix acceptance `α_0 ··· α_n`.

# %%
calibration = heldout_calibration(blocks)
print(
    f"prefix-survival ECE on held-out blocks: {calibration['ece_before']:.4f} raw -> {calibration['ece_after']:.4f} calibrated"
)
print("temperatures per slot:", [round(t, 2) for t in calibration["temperatures"]])
for name in ("before", "after"):
    fig = plotting.reliability_diagram(
        *calibration[f"bins_{name}"], title=f"{name} temperature scaling (prefix ECE {calibration[f'ece_{name}']:.4f})"
    )  # fmt: skip

# %% [markdown]
# Points on the diagonal are calibrated; the bars show how many (block, prefix) pairs fall into each bin - most
# prefixes of a weak drafter have low survival. A small, short-trained head is often already well calibrated (BCE
# on a soft target is a proper scoring rule); temperature scaling matters more for large drafters and when the
# evaluation data differs from the training data. `dspark-lightning calibrate --ckpt_path ...` does the same fit on a
# checkpoint and writes a calibrated copy.
#
# Install the temperatures in the drafter - `speculative_generate` divides the confidence logits by
# `drafter.confidence_temperature`:

# %%
trained_temperatures = module.drafter_config.trained_slots(module.drafter.confidence_temperature, dim=0)
trained_temperatures.copy_(torch.tensor(calibration["temperatures"]))  # a view: writes the drafter's own buffer
survival, observed, prefix_valid = prefix_quantities(
    blocks.confidence_logits, blocks.alpha, blocks.valid, trained_temperatures
)
print(
    "mean predicted prefix survival per n:",
    [round(float(v), 3) for v in (survival * prefix_valid).sum(0) / prefix_valid.sum(0)],
)
print("mean observed prefix acceptance per n:", [round(float(v), 3) for v in (observed * prefix_valid).sum(0) / prefix_valid.sum(0)])  # fmt: skip

# %% [markdown]
# ## Confidence-scheduled decoding
#
# Now real speculative decoding with the target on 8 validation prompts, greedy, `markov` mode. With a threshold,
# each step verifies only the drafted slots `n` with `a_n ≥ threshold` (at least one). Three numbers per threshold:
#
# - **tau**: tokens emitted per target forward (higher = fewer target forwards);
# - **verified**: drafted tokens sent to the target per step (lower = cheaper verification);
# - the ratio **tau / (1 + verified)**: emitted tokens per token the target processes - the efficiency a batched
#   server cares about.

# %%
prompts = cli.datamodule.eval_prompts()
thresholds = [None, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5]
rows = decode_table(module, prompts, ["markov"], 0.0, thresholds, max_new_tokens=64, k=16)
table = pd.DataFrame({"tau": [row.tau for row in rows], "mean_verified": [row.mean_verified for row in rows]})
table["tau / (1 + verified)"] = table["tau"] / (1 + table["mean_verified"])
table.index = ["none (verify all)", *thresholds[1:]]
table.round(3)

# %%
xs = thresholds[1:]
fig, ax = plt.subplots(figsize=(6.5, 3.8))
ax.plot(xs, table["tau"].iloc[1:], marker="o", label="tau (tokens per target forward)")
ax.plot(xs, table["mean_verified"].iloc[1:], marker="s", label="verified drafted tokens per step")
verify_all = table["mean_verified"].iloc[0]
ax.axhline(table["tau"].iloc[0], color="C0", ls=":", label=f"tau when verifying all {verify_all:.0f} slots")
ax.set(xlabel="confidence threshold on a_n", ylabel="tokens", title="confidence-scheduled verification")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Raising the threshold cuts the verified length much faster than it cuts tau: the slots it drops are the ones
# that would have been rejected anyway. Where to stop depends on what a verified token costs. The **cost model**
# option picks the length per step that maximises expected emitted tokens per unit cost,
# `(1 + Σ_{j<n} a_j) / (t0 + t1·n)` for `n` verified slots (slots counted from 0, as `a_n` above), for a verifier
# whose forward costs `t0 + t1·n`:

# %%
for cost_model in [(1.0, 0.02), (1.0, 0.2), (1.0, 1.0)]:
    emitted = forwards = verified = 0
    for prompt in prompts:
        _, stats = speculative_generate(
            module.target, module.drafter, torch.tensor([prompt]), 64, mode="markov", cost_model=cost_model
        )
        emitted, forwards = emitted + sum(stats.emitted_per_step), forwards + stats.target_forwards
        verified += sum(stats.verified_per_step)
    print(f"cost t0 + t1*n = {cost_model}: tau {emitted / forwards:.3f}, verified per step {verified / forwards:.2f}")

# %% [markdown]
# **Scheduling never changes the output.** It only decides how many drafted tokens the target checks; the target
# still emits its own greedy token after the accepted prefix. Every schedule gives the target's own greedy text:

# %%
prompt = torch.tensor([prompts[0]])
reference = module.target.model.generate(prompt, max_new_tokens=48, do_sample=False)
for threshold in (None, 0.1, 0.5):
    output, stats = speculative_generate(
        module.target, module.drafter, prompt, 48, mode="markov", confidence_threshold=threshold
    )
    same = torch.equal(output, reference[:, : output.shape[1]])
    print(f"threshold {threshold}: {stats.target_forwards} target forwards, identical to target.generate: {same}")
