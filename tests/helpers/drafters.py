"""Drafters on tiny targets, packed batches for them, and a decode with and without the drafter context cache."""

from __future__ import annotations

import torch

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from helpers.targets import make_tiny_qwen3

MASK_ID = 63


def packed_batch(seed: int = 0, lengths=(25, 15), batch: int = 2, vocab: int = 60, pad: int = 0):
    """Rows of several documents packed back to back (+ ``pad`` padding positions)."""
    g = torch.Generator().manual_seed(seed)
    S = sum(lengths) + pad
    ids = torch.randint(0, vocab, (batch, S), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(pad, dtype=torch.long)])
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), -1)])
    loss_mask = (torch.rand(batch, S, generator=g) > 0.2) & (doc >= 0)
    return ids, loss_mask, doc.repeat(batch, 1), pos.repeat(batch, 1)


def build(markov=None, block_size=4, num_layers=2, sample_from_anchor=True, backend="sdpa", vocab=None, seed=0, **kw):
    torch.manual_seed(seed)
    target = FrozenTarget(make_tiny_qwen3(seed=seed), num_draft_layers=num_layers)
    cfg = DrafterConfig(
        block_size=block_size,
        num_layers=num_layers,
        max_anchors=6,
        mask_token_id=MASK_ID,
        markov_head=markov,
        confidence_with_markov=markov is not None,
        sample_from_anchor=sample_from_anchor,
        attention_backend=backend,
        **kw,
    )
    torch.manual_seed(seed + 1)
    drafter = DSparkDrafter.for_target(cfg, target, vocab)
    for p in drafter.parameters():  # non-trivial weights everywhere (heads start at zero)
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.3)
    return target, drafter


def run(target, drafter, ids, loss_mask, doc, pos, anchors=None, seed=0, features=None):
    features = features or target.features(ids, pos)
    return drafter(
        ids,
        loss_mask,
        doc,
        pos,
        features.context_features,
        features.final_hidden,
        anchors=anchors,
        generator=torch.Generator().manual_seed(seed),
    )


def random_gated_drafter(num_layers: int = 2, seed: int = 0):
    model = make_tiny_qwen3(vocab_size=48, seed=seed)
    target = FrozenTarget(model, target_layer_ids=[1, 2])
    cfg = DrafterConfig(block_size=5, num_layers=num_layers, mask_token_id=47, markov_head=MarkovHeadConfig("gated", 8))
    drafter = DSparkDrafter.for_target(cfg, target).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.copy_(torch.randn(drafter.markov_head.markov_w2.weight.shape, generator=g))
    return model, target, drafter


def decode_cached_and_uncached(target, drafter, prompt, mode: str, temperature: float) -> list[torch.Tensor]:
    """30 tokens decoded with and without the drafter context cache, from the same sampling seed."""
    outputs = []
    for drafter_cache in (True, False):
        generator = torch.Generator().manual_seed(3)
        out, _ = speculative_generate(
            target, drafter, prompt, 30, mode=mode, k=6, temperature=temperature, generator=generator,
            eos_token_id=[], drafter_cache=drafter_cache,
        )  # fmt: skip
        outputs.append(out)
    return outputs


def oracle_drafts(drafter: DSparkDrafter, text: list[int], wrong=lambda position: False) -> DSparkDrafter:
    """Make ``drafter`` draft ``text`` itself: its cached draft step (the one ``speculative_generate`` calls) returns
    base logits whose argmax at slot k of the block anchored at position p is ``text[p + k + 1]`` (DSpark form), or
    the next token id where ``wrong(p + k + 1)`` - a rejection exactly there. Decode in ``parallel`` mode, which
    drafts the argmax of the base logits; ``text`` must reach past the last block."""
    if not drafter.config.sample_from_anchor:
        raise ValueError("oracle_drafts drafts in the DSpark form (sample_from_anchor=True)")
    vocab, width, B = drafter.draft_vocab_size, drafter.backbone.fc.out_features, drafter.block_size

    def draft_cached(_cache, anchor_tokens: torch.Tensor, anchor_positions: torch.Tensor):
        p = int(anchor_positions[0])
        tokens = [text[p + k + 1] for k in range(B)]
        tokens = [(t + 1) % vocab if wrong(p + k + 1) else t for k, t in enumerate(tokens)]
        base = 20.0 * torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()[None]
        return base, torch.zeros(1, B, width)

    drafter.draft_cached = draft_cached
    return drafter
