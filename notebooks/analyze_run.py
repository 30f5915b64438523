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
# # Analysis of finished runs
#
# Point this notebook at the output of `dspark-lightning fit` and it draws the standard analysis:
#
# 1. loss and tau curves,
# 2. per-slot acceptance by head,
# 3. calibration of the confidence head (before / after sequential temperature scaling),
# 4. Selector coverage@k and agreement@k,
# 5. measured (real speculative decoding with the target) vs teacher-forced tau,
# 6. the offline W&B runs and how to upload them.
#
# **Which runs.** Set `DSPARK_RUN_DIR` to a run directory (`runs/quickstart/version_0`) or to any directory above
# several (`runs/`, or the `--runs_dir` of `dspark-lightning report`): every directory below it with a `metrics.csv`
# is a run. Sections 3-5 load `checkpoints/last.ckpt` (at most `DSPARK_MAX_RUNS`, default 4). Without
# `DSPARK_RUN_DIR` the notebook first trains two tiny runs itself (no Markov head and a vanilla head, 150 steps each,
# with offline W&B logging) in a temporary directory, so it always has something to show.
#
# ```bash
# DSPARK_RUN_DIR=runs/quickstart jupyter lab notebooks/analyze_run.ipynb
# ```

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
import yaml

from dspark_lightning.cli import cli_main
from dspark_lightning.measuring.calibration import heldout_calibration
from dspark_lightning.measuring.loading import load_trained
from dspark_lightning.measuring.tables import measured_decoding
from dspark_lightning.measuring.validation_blocks import collect_blocks
from dspark_lightning.selector import equivalence_report
from dspark_lightning.studies.quiet_output import quiet_logs
from dspark_lightning.studies.runs import demo_fit_args, find_runs, run_label

torch.set_num_threads(1)
quiet_logs()
# %matplotlib inline

RUN_DIR = os.environ.get("DSPARK_RUN_DIR")
MAX_RUNS = int(os.environ.get("DSPARK_MAX_RUNS", "4"))
if RUN_DIR:  # a relative path is from the current directory
    RUN_DIR = Path(RUN_DIR)
    RUN_DIR = RUN_DIR.resolve()
else:
    RUN_DIR = Path(tempfile.mkdtemp(prefix="dspark-analysis-"))
    os.environ["WANDB_MODE"] = "offline"  # the demo runs log to W&B offline, to show those files too
    import wandb

    for head in ("none", "vanilla"):
        cli_main(["fit", *demo_fit_args(RUN_DIR, head=head, steps=150, wandb=True)])
        wandb.finish()  # close this run's W&B files before the next run starts its own
runs = find_runs(RUN_DIR)
assert runs, f"no run (a directory with metrics.csv) under {RUN_DIR}"
print(f"{len(runs)} run(s) under {RUN_DIR}")

# %% [markdown]
# ## Overview
#
# Head and block size come from each run's `config.yaml`; the metrics from `metrics.csv` (CSVLogger: one row per
# logging step, training and validation scalars in different rows).


# %%
def load_run(path: Path) -> dict:
    config = path / "config.yaml"  # written by LightningCLI: the run's fully resolved configuration
    model = yaml.safe_load(config.read_text())["model"] if config.exists() else {}
    head, block = run_label(model)
    log = pd.read_csv(path / "metrics.csv")
    ckpt = path / "checkpoints" / "last.ckpt"
    name = str(path.relative_to(RUN_DIR)) if path != RUN_DIR else path.name
    return {
        "name": name,
        "path": path,
        "head": head,
        "block": block,
        "log": log,
        "ckpt": ckpt if ckpt.exists() else None,
    }


def last(log: pd.DataFrame, column: str):
    values = log[column].dropna() if column in log else []
    return float(values.iloc[-1]) if len(values) else float("nan")


infos = [load_run(path) for path in runs]
overview = pd.DataFrame(
    [
        {
            "run": info["name"],
            "head": info["head"],
            "B": info["block"],
            "steps": int(info["log"]["step"].max()) + 1,
            "val/tau": last(info["log"], "val/tau"),
            "val/greedy_tau": last(info["log"], "val/greedy_tau"),
            "val/confidence/prefix_ece": last(info["log"], "val/confidence/prefix_ece"),
            "checkpoint": info["ckpt"] is not None,
        }
        for info in infos
    ]
).set_index("run")
overview.round(4)

# %% [markdown]
# ## 1. Loss and tau curves
#
# Training scalars are logged every few steps (on the blocks sampled for that step); `val/tau` at each validation (on
# fixed validation blocks, so validations are comparable across runs with the same data).

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for i, info in enumerate(infos):
    log, color, label = info["log"], f"C{i}", f"{info['head']} B={info['block']} ({info['name']})"
    train = log[["step", "train/loss", "train/tau"]].dropna()
    axes[0].plot(train["step"], train["train/loss"], color=color, label=label)
    axes[1].plot(train["step"], train["train/tau"], color=color, alpha=0.6, label=f"{label} train")
    if "val/tau" in log:
        val = log[["step", "val/tau"]].dropna()
        axes[1].plot(val["step"], val["val/tau"], "s-", color=color, markersize=7, label=f"{label} val")
axes[0].set(title="training loss", xlabel="step")
axes[1].set(title="tau", xlabel="step", ylabel="tokens per block")
for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## 2. Per-slot acceptance by head
#
# From the last validation of each run: `val/accept_rate/slot_k` (solid) and `val/greedy_acc/slot_k` (dashed).

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for i, info in enumerate(infos):
    log = info["log"]
    for metric, style in (("accept_rate", "o-"), ("greedy_acc", "x--")):
        columns = sorted(
            (c for c in log if c.startswith(f"val/{metric}/slot_")), key=lambda c: int(c.rsplit("_", 1)[1])
        )
        if not columns:
            continue
        row = log[columns].dropna(how="all").iloc[-1]
        label = f"{info['head']} B={info['block']} {metric}" if metric == "accept_rate" else None
        ax.plot([int(c.rsplit("_", 1)[1]) for c in columns], row.values, style, color=f"C{i}", label=label)
ax.set(xlabel="draft slot k", ylabel="rate", title="per-slot acceptance (solid: accept_rate, dashed: greedy_acc)")
ax.set_ylim(0, None)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 3-5. From the checkpoints
#
# Each checkpoint is re-loaded with `measuring.loading.load_trained` (model and data module from the checkpoint's
# own hyper-parameters; the frozen target from its recorded path) and evaluated on validation blocks
# (`measuring.validation_blocks.collect_blocks`, the deterministic blocks of the validation metrics) and on the data
# module's eval prompts.

# %%
loaded = []
for info in [info for info in infos if info["ckpt"] is not None][:MAX_RUNS]:
    module, data = load_trained(str(info["ckpt"]))
    data.setup("validate")
    blocks = collect_blocks(module, data.val_dataloader(), max_blocks=256)
    loaded.append({**info, "module": module, "data": data, "blocks": blocks})
    print(f"{info['name']}: {blocks.num_blocks} validation blocks")

# %% [markdown]
# ### 3. Calibration of the confidence head
#
# Reliability of the prefix survival `a_n = c_0 ··· c_n` against the observed prefix acceptance, on half of the
# blocks, before and after sequential temperature scaling fitted on the other half
# (`measuring.calibration.heldout_calibration`).

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
ece = {}
for i, run in enumerate(r for r in loaded if r["blocks"].confidence_logits is not None):
    calibration = heldout_calibration(run["blocks"])
    ece[run["name"]] = {"prefix ECE raw": calibration["ece_before"], "prefix ECE calibrated": calibration["ece_after"]}
    for ax, when in zip(axes, ("before", "after")):
        predicted, observed, counts = calibration[f"bins_{when}"]
        label = f"{run['head']} B={run['block']} (prefix ECE {calibration[f'ece_{when}']:.3f})"
        ax.plot(predicted, observed, "o-", color=f"C{i}", label=label)
for ax, when in zip(axes, ("raw", "after temperature scaling")):
    ax.plot([0, 1], [0, 1], "--", color="gray")
    ax.set(title=f"prefix survival, {when}", xlabel="predicted prefix survival", xlim=(0, 1), ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
axes[0].set_ylabel("observed prefix acceptance")
fig.tight_layout()
pd.DataFrame(ece).T.round(4)

# %% [markdown]
# ### 4. Selector coverage@k and agreement@k
#
# For runs whose head has a Selector form (vanilla, gated): how often the sequential Markov decode's token is among
# the top-`k` base logits (coverage), and how often the top-`k` walk picks it (agreement). If the run logged the
# `SelectorEquivalenceCallback` (the quickstart config does), its last logged values are listed too.

# %%
fig, ax = plt.subplots(figsize=(7, 4))
ks = (1, 2, 4, 8, 16, 32, 64)
selector_rows = {}
for i, run in enumerate(loaded):
    head = run["module"].drafter.markov_head
    if head is None or head.is_path_dependent:
        print(f"{run['name']}: {run['head']} head has no Selector form")
        continue
    b = run["blocks"]
    report = equivalence_report(b.base_logits, head, b.first_prev, b.hidden, b.teacher_logprobs, ks, b.valid)
    label = f"{run['head']} B={run['block']}"
    ax.plot(ks, [report.coverage[k] for k in ks], "o-", color=f"C{i}", label=f"{label} coverage")
    ax.plot(ks, [report.agreement[k] for k in ks], "x--", color=f"C{i}", label=f"{label} agreement")
    selector_rows[run["name"]] = {"coverage@16": report.coverage[16], "agreement@16": report.agreement[16],
                                  "tau walk@16": report.tau_walk[16], "tau sequential": report.tau_sequential}  # fmt: skip
    for key in ("coverage@16", "agreement@16"):
        selector_rows[run["name"]][f"logged val/selector/{key}"] = last(run["log"], f"val/selector/{key}")
ax.set_xscale("log", base=2)
ax.set(xlabel="k (candidates per slot)", ylabel="fraction of slots", title="Selector walk vs sequential decode")
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
fig.tight_layout()
pd.DataFrame(selector_rows).T.round(3)

# %% [markdown]
# ### 5. Measured vs teacher-forced tau
#
# Teacher-forced tau scores the drafter on ground-truth prefixes; measured tau is tokens per target forward in real
# greedy speculative decoding with the target on the eval prompts (`markov` mode; `parallel` without a Markov head).
# The gap between them is the train/serve gap: exposure to the drafter's own earlier tokens and to the target's own
# continuations. `val/decode/<mode>/tau` is the same measurement logged during training by the
# `SpeculativeDecodingCallback`, when the run had it.

# %%
rows = {}
for run in loaded:
    module = run["module"]
    mode = "parallel" if module.drafter.markov_head is None else "markov"
    prompts = run["data"].eval_prompts()[:8]
    decoded = measured_decoding(module, prompts, [mode], max_new_tokens=64, k=16)[mode]
    rows[f"{run['head']} B={run['block']}\n{run['name']}"] = {
        "teacher-forced tau": last(run["log"], "val/tau"),
        "teacher-forced greedy tau": last(run["log"], "val/greedy_tau"),
        f"measured tau ({len(prompts)} prompts)": decoded.tau,
        "logged val/decode tau": last(run["log"], f"val/decode/{mode}/tau"),
    }
table = pd.DataFrame(rows).T
ax = table.plot.bar(figsize=(7, 3.8), rot=0, title="teacher-forced vs measured tau")
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_ylabel("tokens per target forward")
ax.legend(fontsize=8)
ax.figure.tight_layout()
table.round(3)

# %% [markdown]
# ## 6. Offline W&B runs
#
# Runs logged with the `OfflineFirstWandbLogger` keep a complete W&B run under `wandb/offline-run-*` next to the CSV
# versions. `wandb sync` uploads them after `wandb login`.

# %%
offline = sorted(RUN_DIR.rglob("offline-run-*"))
if not offline and (RUN_DIR.parent / "wandb").exists():  # a version_N directory: W&B lives one level up
    offline = sorted((RUN_DIR.parent / "wandb").glob("offline-run-*"))
for run in offline:
    size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    print(f"wandb sync {run}    # {size / 1024:.0f} KiB")
if not offline:
    print(f"no offline W&B run under {RUN_DIR}")
