"""A Markov head with random (non-zero) weights in float64, for the Selector tests."""

from __future__ import annotations

import torch

from dspark_lightning.models import MarkovHead

DTYPE = torch.float64


def make_head(form, vocab=11, draft_vocab=None, rank=4, hidden_size=6, seed=0, w2_std=0.7):
    kind, gate_input, gate_activation = form
    torch.manual_seed(seed)
    head = MarkovHead(
        verifier_vocab_size=vocab,
        draft_vocab_size=draft_vocab or vocab,
        rank=rank,
        hidden_size=hidden_size,
        kind=kind,
        gate_input=gate_input,
        gate_activation=gate_activation,
    ).to(DTYPE)
    with torch.no_grad():
        head.markov_w2.weight.normal_(0.0, w2_std)  # starts at zero: make the bias matter
        for name, param in head.named_parameters():
            if name.startswith(("gate_proj", "joint_proj")):
                param.normal_(0.0, 0.5)
    return head.requires_grad_(False)
