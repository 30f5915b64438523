"""Reference side of ``step_vs_speculators``: one DSpark training step of the public ``speculators`` library.

Runs under the throw-away venv's python (never under the project's environment, which must not depend on
``speculators``); it imports only ``speculators``, ``torch`` and ``safetensors`` and uses their public training API:

- ``speculators.train.cli.create_transformer_layer_config`` builds the draft decoder config from the verifier
  directory (the same path their ``train`` CLI takes when no ``--draft-config`` is given);
- ``speculators.models.dspark.DSparkDraftModel.from_training_args`` builds the model and loads the verifier's
  embedding / LM head from that directory;
- ``DSparkDraftModel.get_trainer_kwargs(loss_fn=..., loss_implementation="eager", ...)`` resolves the compound loss
  with their eager (non-Triton) losses, as their trainer does;
- a step is what their ``Trainer`` does per batch: ``_, loss, metrics = model(**batch, **train_kwargs)``,
  ``zero_grad``, ``loss.backward()``, ``clip_grad_norm_(1.0)``, ``optimizer.step()`` (no autocast: fp32 on CPU;
  ``precision: bf16`` in the config wraps the forward in bf16 autocast, as on our side).

Protocol (driven by ``step_vs_speculators``): argv[1] is a JSON config; the driver builds the model, runs the warm-up
steps, prints ``@@ {"ready": ...}`` and then answers each stdin line ``run N`` with ``@@ {"steps": [...]}`` (per-step
forward / backward / optimizer seconds) until ``quit``. Only ``@@`` lines on stdout are protocol; logs go to stderr.
"""

from __future__ import annotations

import json
import sys
import time


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _say(payload: dict) -> None:
    print("@@ " + json.dumps(payload), flush=True)


def main() -> None:
    cfg = json.loads(open(sys.argv[1]).read())
    import torch

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    from safetensors.torch import load_file
    from speculators.models.dspark import DSparkDraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.version import version as speculators_version

    layer_config = create_transformer_layer_config(
        verifier_name_or_path=cfg["target_dir"],
        num_layers=cfg["num_layers"],
        draft_arch="qwen3",
        hidden_act=None,
        sliding_window=cfg["seq_len"],
        full_attention_indices=list(range(cfg["num_layers"])),  # full (non-windowed) attention, like ours
    )
    model = DSparkDraftModel.from_training_args(
        verifier_config=layer_config,
        verifier_name_or_path=cfg["target_dir"],
        draft_vocab_size=cfg["vocab_size"],
        block_size=cfg["block_size"],
        target_layer_ids=cfg["target_layer_ids"],
        mask_token_id=cfg["mask_token_id"],
        sample_from_anchor=True,
        markov_rank=cfg["markov_rank"],
        markov_head_type=cfg["markov_kind"],
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        draft_attn_impl=cfg["reference_attention"],
    )
    train_kwargs, _ = DSparkDraftModel.get_trainer_kwargs(
        loss_fn=json.dumps(cfg["loss"]),
        loss_implementation="eager",
        max_anchors=cfg["max_anchors"],
        dflash_decay_gamma=cfg["gamma"],
        confidence_head_alpha=1.0,
        per_position_loss_weight="fixed-exp-decay",
    )
    inputs = load_file(cfg["inputs"])
    batch = {
        "hidden_states": inputs["context_features"],
        "input_ids": inputs["input_ids"],
        "loss_mask": inputs["loss_mask"],
        "verifier_last_hidden_states": inputs["final_hidden"],
        "document_ids": inputs["document_ids"],
        "position_ids": inputs["position_ids"],
    }
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    model.train()

    bf16 = cfg.get("precision") == "bf16"

    def step() -> dict:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # the same autocast as our side
            _, loss, _metrics = model(**batch, **train_kwargs)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "loss": float(loss.detach())}

    for _ in range(cfg["warmup"]):
        step()
    _say(
        {
            "ready": True,
            "version": speculators_version,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "trainable_params": sum(p.numel() for p in params),
            "attention": cfg["reference_attention"],
        }
    )
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        steps = [step() for _ in range(int(command[1]))]
        _say({"steps": steps, "peak_rss_mib": _peak_rss_mib()})


if __name__ == "__main__":
    main()
