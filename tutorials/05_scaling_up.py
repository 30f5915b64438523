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
# # 05 · Scaling up: real targets, W&B online, many GPUs, the offline feature cache
#
# Everything in tutorials 01-04 ran against a 1M-parameter demo target on a CPU. The same code trains drafters for
# real targets; what changes is configuration. This notebook explains the settings and prints the commands - it
# **does not run them** (they need GPUs, the Hugging Face hub and hours). The only thing it executes is reading and
# resolving config files.

# %%
import contextlib
import io

import pandas as pd
import yaml

from dspark_lightning.cli import cli_main
from dspark_lightning.shipped import SHIPPED_ROOT as REPO  # the shipped configs/ and assets/ (a checkout or a wheel)
from dspark_lightning.studies.quiet_output import quiet_logs

quiet_logs()


def show(*commands):
    """Print shell commands (this notebook never runs them)."""
    for command in commands:
        print(command, end="\n\n")


# %% [markdown]
# ## 1. The real-model configs
#
# `configs/qwen3_0_6b_sharegpt.yaml` (one 80 GB GPU) and `configs/qwen3_8b_sharegpt.yaml` (8 GPUs) are complete
# recipes. Side by side with the demo quickstart, the settings that matter:

# %%
configs = {
    "quickstart (demo, CPU)": "configs/quickstart.yaml",
    "Qwen3-0.6B": "configs/qwen3_0_6b_sharegpt.yaml",
    "Qwen3-8B": "configs/qwen3_8b_sharegpt.yaml",
}
keys = [
    "model.target.path", "model.target.dtype", "model.drafter.block_size", "model.drafter.num_layers",
    "model.drafter.target_layer_ids", "model.drafter.max_anchors", "model.drafter.markov_head.rank", "model.loss.gamma",
    "model.drafter.attention_backend",
    "model.optimizer.init_args.lr", "data.train_files", "data.seq_len", "data.batch_size", "data.mask_token",
    "trainer.accelerator", "trainer.devices", "trainer.precision", "trainer.max_steps",
]  # fmt: skip


def lookup(tree, dotted):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return "(default)"
        tree = tree[part]
    return str(tree)


table = {}
for name, path in configs.items():
    file = REPO / path
    tree = yaml.safe_load(file.read_text()) if file.exists() else {}
    table[name] = {key: lookup(tree, key) for key in keys}
pd.DataFrame(table)

# %% [markdown]
# What the numbers mean:
#
# - **`target.path`** is a hub id; the tokenizer comes with it (linked into the data module). Qwen3 has no mask token,
#   so `data.mask_token` names an unused special token. `drafter.target_layer_ids` picks the target layers whose
#   hidden states feed the drafter (spread over depth, as in EAGLE-3 / DFlash).
# - **Blocks and anchors.** `drafter.block_size` 16 drafts 16 tokens per verification. `max_anchors` blocks are
#   sampled per packed row: anchors x block size = draft rows per sequence, the main memory knob together with
#   `seq_len` (`python -m benchmarks.training.step_scaling` measures step time and memory against both; the loss is computed
#   in row chunks so the `(A·B) x Vd` logits never exist in several fp32 copies).
# - **`loss.gamma`** of the `exp(-k/gamma)` position weights grows with the block size, so late slots still learn.
# - **`drafter.attention_backend`**: `flex` compiles FlexAttention block masks on CUDA (it has no backward on CPU, so
#   a CPU fit refuses it); `auto`, the default, picks flex on CUDA and SDPA with a dense boolean mask elsewhere.
# - **Precision**: `bf16-mixed` for the drafter; the frozen target is loaded in `model.target.dtype`.
# - **Data**: a hub ShareGPT dataset, streamed (never downloaded whole); train on *on-policy* data - the target's
#   own answers - for a drafter that matches what the target will actually generate:

# %%
show(
    "dspark-lightning regenerate --target Qwen/Qwen3-8B --data Aeala/ShareGPT_Vicuna_unfiltered:train "
    "--output data/qwen3_8b_regenerated --chat_template_kwargs '{enable_thinking: false}'",
    "dspark-lightning fit --config configs/qwen3_8b_sharegpt.yaml --data.train_files 'data/qwen3_8b_regenerated/*.jsonl'",
)

# %% [markdown]
# Compose and inspect before you launch: `--print_config` resolves every `--config` and override into one YAML
# without loading any model (this cell runs it, for the 8B recipe + DDP + the W&B logger):

# %%
command = [
    "fit",
    "--config", str(REPO / "configs/qwen3_8b_sharegpt.yaml"),
    "--config", str(REPO / "configs/strategy/ddp.yaml"),
    "--config", str(REPO / "configs/logger/wandb.yaml"),
    "--print_config",
]  # fmt: skip
printed = io.StringIO()
with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
    cli_main(command)
resolved = yaml.safe_load(printed.getvalue())
print(yaml.safe_dump({
    "model": {
        "target": resolved["model"]["target"]["path"],
        "drafter": {k: resolved["model"]["drafter"][k] for k in ("block_size", "max_anchors", "markov_head")},
    },
    "trainer": {
        "accelerator": resolved["trainer"]["accelerator"],
        "devices": resolved["trainer"]["devices"],
        "precision": resolved["trainer"]["precision"],
        "strategy": resolved["trainer"]["strategy"]["class_path"],
        "logger": [logger["class_path"] for logger in resolved["trainer"]["logger"]],
    },
}, sort_keys=False))  # fmt: skip

# %% [markdown]
# ## 2. Weights & Biases online
#
# Every config can log to W&B: the quickstart already does (offline), the real recipes get it by composing
# `configs/logger/wandb.yaml`. The logger is offline unless `WANDB_MODE=online`, so nothing is ever uploaded by
# accident. Metrics to watch: `val/tau` and `val/accept_rate/slot_k` (teacher-forced), `val/decode/<mode>/tau`
# (measured with the target), `val/selector/agreement@16`, `val/confidence/prefix_ece`, and the charts under
# `val/` (per-slot acceptance, reliability diagram, Selector coverage).

# %%
show(
    "wandb login",
    "WANDB_MODE=online dspark-lightning fit --config configs/qwen3_0_6b_sharegpt.yaml "
    "--config configs/logger/wandb.yaml --trainer.logger.init_args.project my-drafters",
    "wandb sync runs/dspark/wandb/offline-run-*   # upload runs that were logged offline",
)

# %% [markdown]
# ## 3. Many GPUs: DDP, FSDP, several nodes
#
# - **DDP** (`configs/strategy/ddp.yaml`, `devices: auto` = every visible GPU) - the default way to scale out while the target fits on one GPU: one process
#   per GPU, each with the frozen target and a drafter replica; drafter gradients are all-reduced. Data shards are
#   split across ranks by the streaming data module; validation metrics are summed across ranks (exact).
# - **FSDP** (`configs/strategy/fsdp.yaml`) - for targets that do not fit on one GPU: the frozen target is sharded
#   layer by layer and the drafter trains sharded; checkpoints are still a single file holding only the drafter.
# - **Several nodes**: the same command under `torchrun` or SLURM, with `--trainer.num_nodes`.

# %%
show(
    "dspark-lightning fit --config configs/qwen3_8b_sharegpt.yaml --config configs/strategy/ddp.yaml --trainer.devices 8",
    "dspark-lightning fit --config configs/qwen3_8b_sharegpt.yaml --config configs/strategy/fsdp.yaml --trainer.devices 8",
    "# two nodes x 8 GPUs with torchrun (run on every node; NODE_RANK = 0, 1):\n"
    "torchrun --nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK --master_addr $MASTER --master_port 29500 \\\n"
    "    -m dspark_lightning fit --config configs/qwen3_8b_sharegpt.yaml --config configs/strategy/ddp.yaml \\\n"
    "    --trainer.num_nodes 2 --trainer.devices 8",
    "# SLURM: one task per GPU; Lightning reads the SLURM environment\n"
    "srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 \\\n"
    "    dspark-lightning fit --config configs/qwen3_8b_sharegpt.yaml --trainer.num_nodes 2 --trainer.devices 8",
)

# %% [markdown]
# ## 4. The offline hidden-state cache
#
# Online training runs the frozen target forward on every batch. When the same data is used for many runs (head
# ablations, block sizes, learning rates), run the target **once** and store what the drafter needs - input ids,
# loss mask, document ids, the fused hidden states of the target layers and the final hidden state - in safetensors
# shards. Training from the cache (`configs/cache.yaml`) keeps only the target's embedding and LM head in memory and
# gives the same loss as online training on the same samples. The command prints a size estimate first
# (`--dry_run true` stops there); for a target larger than one GPU, `--device_map auto` spreads it while caching.

# %%
show(
    "dspark-lightning cache --target Qwen/Qwen3-8B --data 'data/qwen3_8b_regenerated/*.jsonl' "
    "--output cache/qwen3_8b/train --seq_len 8192 --block_size 16 --layers '[1,9,17,25,33]' --dry_run true "
    "--chat_template_kwargs '{enable_thinking: false}'",
    "dspark-lightning cache --target Qwen/Qwen3-8B --data 'data/qwen3_8b_regenerated/*.jsonl' "
    "--output cache/qwen3_8b/train --seq_len 8192 --block_size 16 --layers '[1,9,17,25,33]' --device_map auto "
    "--chat_template_kwargs '{enable_thinking: false}'",
    "# the validation cache, from the config's data.val_files (held-out conversations of your domain):\n"
    "dspark-lightning cache --target Qwen/Qwen3-8B --data 'assets/data/sharegpt/validation-*.jsonl' "
    "--output cache/qwen3_8b/val --seq_len 8192 --block_size 16 --layers '[1,9,17,25,33]' --device_map auto "
    "--chat_template_kwargs '{enable_thinking: false}'",
    "dspark-lightning fit --config configs/qwen3_8b_sharegpt.yaml --config configs/cache.yaml "
    "--data.train_cache cache/qwen3_8b/train --data.val_cache cache/qwen3_8b/val",
)

# %% [markdown]
# At demo scale the whole path runs on a CPU in seconds, which is a good way to check a setup before renting GPUs:

# %%
show(
    "dspark-lightning cache --target assets/demo-target --data 'assets/data/regenerated/train-*.jsonl' "
    "--output cache/train --seq_len 256",
    "dspark-lightning cache --target assets/demo-target --data 'assets/data/sharegpt/validation-*.jsonl' "
    "--output cache/val --seq_len 256",
    "dspark-lightning fit --config configs/quickstart.yaml --config configs/cache.yaml",
)

# %% [markdown]
# ## 5. After training
#
# Measure, calibrate, export - all from the checkpoint. The export is a directory in the `speculators` DSpark format
# (`config.json` + `model.safetensors`) that vLLM's speculative decoding loads as the draft model.

# %%
show(
    "dspark-lightning decode --ckpt_path runs/qwen3_8b/version_0/checkpoints/last.ckpt --modes '[parallel,markov,selector]'",
    "dspark-lightning calibrate --ckpt_path runs/qwen3_8b/version_0/checkpoints/last.ckpt",
    "dspark-lightning export --ckpt_path runs/qwen3_8b/version_0/checkpoints/last.calibrated.ckpt --output export/qwen3_8b_dspark",
)
