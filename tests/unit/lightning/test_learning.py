"""An honest learning check: a drafter trained on a fixed random tiny target lowers its loss and raises tau.

The target is a random Qwen3 (no training), the data random token sequences; what the drafter can learn is the
target's own next-token distribution, which is a deterministic function of the context it reads. Measured on a
held-out batch before and after 120 AdamW steps.
"""

from __future__ import annotations

import torch
from helpers.targets import make_tiny_qwen3

from dspark_lightning.losses import compound_loss, confidence_loss, position_weights
from dspark_lightning.metrics import AcceptanceMetrics
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig


def evaluate(target, drafter, batch, spec):
    with torch.no_grad():
        ids, pos = batch
        features = target.features(ids, pos)
        out = drafter(
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            torch.zeros_like(ids),
            pos,
            features.context_features,
            features.final_hidden,
            generator=torch.Generator().manual_seed(123),
        )
        B = drafter.block_size
        res = compound_loss(
            out.logits.flatten(0, 1),
            out.teacher_logprobs.flatten(0, 1),
            position_weights(B),
            out.slot_valid.flatten(0, 1),
            spec,
        )
        metric = AcceptanceMetrics(B)
        metric.update(res.alpha, res.greedy_match, out.slot_valid.flatten(0, 1))
        return float(res.loss), float(metric.compute()["tau"])


def test_drafter_learns_the_targets_distribution():
    torch.manual_seed(0)
    # a peaked random target: scale its LM head so its next-token distribution is learnable within 120 steps
    model = make_tiny_qwen3(vocab_size=48, hidden_size=32, num_layers=4, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    target = FrozenTarget(model, num_draft_layers=1)
    cfg = DrafterConfig(
        block_size=4, num_layers=1, max_anchors=16, mask_token_id=47, markov_head=MarkovHeadConfig(rank=16)
    )
    drafter = DSparkDrafter.for_target(cfg, target)
    spec = {"ce": 0.1, "tv": 0.9}
    g = torch.Generator().manual_seed(0)
    S = 48
    held_out = (torch.randint(0, 47, (8, S), generator=g), torch.arange(S).repeat(8, 1))
    loss_before, tau_before = evaluate(target, drafter, held_out, spec)

    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    B = cfg.block_size
    for _ in range(120):
        ids = torch.randint(0, 47, (8, S), generator=g)
        pos = torch.arange(S).repeat(8, 1)
        features = target.features(ids, pos)
        out = drafter(
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            torch.zeros_like(ids),
            pos,
            features.context_features,
            features.final_hidden,
            generator=g,
        )
        res = compound_loss(
            out.logits.flatten(0, 1),
            out.teacher_logprobs.flatten(0, 1),
            position_weights(B),
            out.slot_valid.flatten(0, 1),
            spec,
        )
        conf = confidence_loss(
            out.confidence_logits.flatten(0, 1), res.alpha, res.weights, out.slot_valid.flatten(0, 1)
        )
        optimizer.zero_grad()
        (res.loss + conf).backward()
        optimizer.step()

    loss_after, tau_after = evaluate(target, drafter, held_out, spec)
    print(f"loss {loss_before:.4f} -> {loss_after:.4f}, tau {tau_before:.3f} -> {tau_after:.3f}")
    assert loss_after < 0.8 * loss_before, (loss_before, loss_after)
    assert tau_after > tau_before + 0.1, (tau_before, tau_after)
