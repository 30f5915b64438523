"""The teacher from cached statistics (draft rows only) and from the full vocabulary equal the full-vocabulary
log-softmax, and train the drafter to the same loss and gradients, in float64 (docs/design/design.md §3.6)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.drafters import packed_batch
from helpers.paths import ROOT
from helpers.targets import make_tiny_qwen3

import dspark_lightning.models.drafter as drafter_module
from dspark_lightning.lightning.config import LossArgs
from dspark_lightning.lightning.step import step_output
from dspark_lightning.losses import validate_spec
from dspark_lightning.models import DrafterConfig, DraftVocab, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.anchors import sample_anchors
from dspark_lightning.models.target import load_causal_lm
from dspark_lightning.models.teacher import TeacherStats, full_vocab_stats, full_vocab_teacher

LOSS = LossArgs(weights={"kl": 0.5, "tv": 0.4, "ce": 0.1})


def float64_setup(kind: str, draft_vocab: bool):
    """A float64 target (the tiny random Qwen3 or the demo target) and a drafter with non-trivial weights."""
    torch.manual_seed(0)
    model = make_tiny_qwen3(seed=0) if kind == "tiny_qwen3" else load_causal_lm(str(ROOT / "assets/demo-target"))
    model = model.double()
    target = FrozenTarget(model, num_draft_layers=1)
    vocab_size = target.vocab_size
    vocab = None
    if draft_vocab:  # every other id: the argmax of the full vocabulary is often outside it
        vocab = DraftVocab(torch.arange(0, vocab_size, 2), vocab_size)
    cfg = DrafterConfig(
        block_size=4, max_anchors=8, mask_token_id=vocab_size - 1, markov_head=MarkovHeadConfig(rank=4),
        confidence_head=True, confidence_with_markov=True, attention_backend="sdpa",
    )  # fmt: skip
    drafter = DSparkDrafter.for_target(cfg, target, vocab).double()
    for p in drafter.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.3)
    return target, drafter


def forward(drafter, batch, features, anchors, stats):
    ids, loss_mask, doc, pos = batch
    return drafter(
        ids, loss_mask, doc, pos, features.context_features, features.final_hidden, anchors=anchors,
        teacher_stats=stats,
    )  # fmt: skip


def loss_and_grads(drafter, out):
    drafter.zero_grad(set_to_none=True)
    loss = step_output(out, LOSS, validate_spec(dict(LOSS.weights)), drafter).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("draft_vocab", [True, False], ids=["Vd<V", "Vd=V"])
@pytest.mark.parametrize("kind", ["tiny_qwen3", "demo"])
def test_teacher_paths_equal_the_full_log_softmax_loss_and_gradients(kind, draft_vocab, monkeypatch):
    target, drafter = float64_setup(kind, draft_vocab)
    batch = packed_batch(seed=3, lengths=(25, 15), vocab=60, pad=3)
    ids, loss_mask, doc, pos = batch
    features = target.features(ids, pos)
    anchors = sample_anchors(loss_mask, doc, 4, 8, True, torch.Generator().manual_seed(1))

    # the reference: the old full path, log_softmax over V at the predicted - 1 positions, gathered at d2t
    predicted = (anchors.positions[:, :, None] + torch.arange(4) + 1).clamp(max=ids.shape[1] - 1)
    hidden = features.final_hidden
    rows = hidden.gather(1, (predicted - 1).flatten(1)[..., None].expand(-1, -1, hidden.shape[-1]))
    full = torch.log_softmax(drafter.lm_head(rows), -1).view(*predicted.shape, -1)
    reference = full if drafter.d2t is None else full[..., drafter.d2t]
    reference_argmax = full.argmax(-1)

    stats = TeacherStats(*full_vocab_stats(features.final_hidden, drafter.lm_head.weight))
    online = forward(drafter, batch, features, anchors, None)
    monkeypatch.setattr(drafter_module, "full_vocab_teacher", None)  # the cache path never evaluates the V-wide head
    cached = forward(drafter, batch, features, anchors, stats)
    monkeypatch.undo()
    for out in (online, cached):
        assert out.teacher_logprobs.dtype == torch.float64
        torch.testing.assert_close(out.teacher_logprobs, reference, rtol=1e-12, atol=1e-12)
        assert torch.equal(out.teacher_argmax, reference_argmax)

    # the reference as a table of one row per slot, each slot reading its own row
    rows = torch.arange(reference[..., 0].numel()).view(reference.shape[:-1])
    table = reference.reshape(-1, reference.shape[-1])
    loss_ref, grads_ref = loss_and_grads(
        drafter,
        dataclasses.replace(forward(drafter, batch, features, anchors, None), teacher_table=table, teacher_rows=rows),
    )
    for out in (online, cached):
        loss, grads = loss_and_grads(drafter, out)
        torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-14)
        assert grads.keys() == grads_ref.keys() and grads
        for name, grad in grads.items():
            torch.testing.assert_close(grad, grads_ref[name], rtol=1e-10, atol=1e-13, msg=name)


def test_full_vocab_pass_in_chunks_equals_one_pass_and_takes_the_first_maximum():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    weight[31] = weight[17] = 3 * hidden[1, 2]  # a tie at the maximum of row (1, 2): the first index wins
    logits = hidden @ weight.T
    for chunk in (1, 50, 10**6):  # one row per chunk, one row of V, everything at once
        lse, argmax = full_vocab_stats(hidden, weight, chunk_elements=chunk)
        torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-13, atol=1e-13)
        assert torch.equal(argmax, logits.argmax(-1)) and argmax[1, 2] == 17
        d2t = torch.tensor([0, 17, 31, 49])
        logprobs, same = full_vocab_teacher(hidden, weight, d2t, chunk_elements=chunk)
        torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[..., d2t], rtol=1e-13, atol=1e-13)
        assert torch.equal(same, argmax)
    assert full_vocab_stats(hidden, torch.zeros(50, 16, dtype=torch.float64))[1].eq(0).all()  # all tied: index 0


def test_full_vocab_pass_over_row_and_vocabulary_tiles_equals_the_log_softmax():
    """A vocabulary larger than one tile (the streaming logsumexp across tiles), several row tiles, a maximum tied
    across two tiles (the first index wins), draft ids in any order, and a soft-cap."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(21, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(10_000, 8, generator=g, dtype=torch.float64)
    weight[9_000] = weight[100] = 4 * hidden[5]  # tiles of 4096 ids: 100 and 9,000 lie in the first and the third
    d2t = torch.randperm(10_000, generator=g)[:700]
    for softcap in (None, 2.0):
        logits = hidden @ weight.T
        logits = logits if softcap is None else softcap * torch.tanh(logits / softcap)
        law = torch.log_softmax(logits, -1)
        for chunk in (3 * 4096, 1 << 22):  # 7 row tiles x 3 vocabulary tiles, and one tile
            lse, argmax = full_vocab_stats(hidden, weight, chunk_elements=chunk, softcap=softcap)
            torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-13, atol=1e-13)
            assert torch.equal(argmax, logits.argmax(-1)) and argmax[5] == 100
            logprobs, same = full_vocab_teacher(hidden, weight, d2t, chunk_elements=chunk, softcap=softcap)
            torch.testing.assert_close(logprobs, law[:, d2t], rtol=1e-13, atol=1e-13)
            assert torch.equal(same, argmax)
            everything, _ = full_vocab_teacher(hidden, weight, None, chunk_elements=chunk, softcap=softcap)
            torch.testing.assert_close(everything, law, rtol=1e-13, atol=1e-13)


def test_duplicate_teacher_positions_are_computed_once_and_spread_back():
    target, drafter = float64_setup("tiny_qwen3", True)
    ids, _, _, pos = packed_batch(seed=1, lengths=(20,), batch=2)
    hidden = target.features(ids, pos).final_hidden
    positions = torch.tensor([[[3, 4, 5], [4, 5, 6]], [[0, 0, 19], [7, 8, 9]]])  # overlaps, repeats, both rows
    stats = TeacherStats(*full_vocab_stats(hidden, drafter.lm_head.weight))
    for path in (None, stats):
        logprobs, argmax = drafter.teacher(hidden, positions, path)
        for b, a, k in torch.cartesian_prod(*(torch.arange(n) for n in positions.shape)).tolist():
            full = torch.log_softmax(drafter.lm_head(hidden[b, positions[b, a, k]]), -1)
            torch.testing.assert_close(logprobs[b, a, k], full[drafter.d2t], rtol=1e-12, atol=1e-12)
            assert argmax[b, a, k] == full.argmax()
