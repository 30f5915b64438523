"""Training the Selector as a gated Markov head: the candidate loss and DFlash-2 CandidateSelector weight conversion."""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_lightning.models import MarkovHead
from dspark_lightning.selector import (
    candidate_loss,
    candidate_selector_scores,
    from_candidate_selector,
    pair_scores,
    selector_decode,
    to_candidate_selector,
)

DTYPE = torch.float64
DFLASH2_FORM = {"kind": "gated", "gate_input": "hidden", "gate_activation": "identity"}


def make_head(vocab=11, draft_vocab=None, rank=4, hidden_size=6, seed=0, **form):
    torch.manual_seed(seed)
    head = MarkovHead(
        verifier_vocab_size=vocab, draft_vocab_size=draft_vocab or vocab, rank=rank, hidden_size=hidden_size, **form
    ).to(DTYPE)
    with torch.no_grad():
        head.markov_w2.weight.normal_(0.0, 0.7)
        for name, param in head.named_parameters():
            if name.startswith("gate_proj"):
                param.normal_(0.0, 0.5)
    return head


def make_batch(n_rows, block, draft_vocab, vocab, hidden_size, seed):
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(n_rows, block, draft_vocab, generator=generator, dtype=DTYPE) * 1.5
    hidden = torch.randn(n_rows, block, hidden_size, generator=generator, dtype=DTYPE)
    prev = torch.randint(0, vocab, (n_rows, block), generator=generator)
    return base, prev, hidden, generator


# ------------------------------------------------------------------------------------------------ candidate loss
def brute_force_candidate_loss(base, head, prev, hidden, target, k, valid, rule):
    losses, in_topk, n_valid = [], 0, 0
    for n, t in itertools.product(range(base.shape[0]), range(base.shape[1])):
        if not valid[n, t]:
            continue
        n_valid += 1
        candidates = base[n, t].topk(k).indices.tolist()
        if int(target[n, t]) in candidates:
            in_topk += 1
        elif rule == "exclude":
            continue
        else:
            candidates[-1] = int(target[n, t])
        logits = base[n, t] + head.block_bias(prev[n, t].view(1, 1), hidden[n, t].view(1, 1, -1))[0, 0]
        scores = logits[candidates]
        losses.append(-torch.log_softmax(scores, dim=0)[candidates.index(int(target[n, t]))])
    return torch.stack(losses).mean(), in_topk / n_valid


@pytest.mark.parametrize("rule", ["replace_kth", "exclude"])
@pytest.mark.parametrize(
    "form",
    [DFLASH2_FORM, {"kind": "vanilla"}, {"kind": "gated", "gate_input": "hidden+prev"}],
    ids=["dflash2", "vanilla", "gated-hidden+prev"],
)
def test_candidate_loss_equals_brute_force(rule, form):
    vocab, k = 9, 3
    head = make_head(vocab, seed=1, **form)
    base, prev, hidden, generator = make_batch(4, 5, vocab, vocab, 6, seed=1)
    top = base.topk(k, dim=-1).indices
    # half of the targets inside the top-k, half drawn from outside it
    outside = base.topk(vocab, dim=-1).indices[..., k:]
    pick_inside = torch.rand(4, 5, generator=generator) < 0.5
    target = torch.where(
        pick_inside,
        top.gather(-1, torch.randint(0, k, (4, 5, 1), generator=generator)).squeeze(-1),
        outside.gather(-1, torch.randint(0, vocab - k, (4, 5, 1), generator=generator)).squeeze(-1),
    )
    valid = torch.rand(4, 5, generator=generator) < 0.8
    loss, stats = candidate_loss(base, head, prev, hidden, target, k, valid, rule=rule)
    expected_loss, expected_recall = brute_force_candidate_loss(base, head, prev, hidden, target, k, valid, rule)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-12)
    assert float(stats.recall) == pytest.approx(expected_recall)
    assert int(stats.num_valid) == int(valid.sum())
    assert int(stats.num_in_topk) == int((pick_inside & valid).sum())
    trained = valid if rule == "replace_kth" else valid & pick_inside
    assert int(stats.num_trained) == int(trained.sum())


def test_candidate_loss_trains_head_and_base_and_handles_empty_slots():
    vocab, k = 9, 2
    head = make_head(vocab, seed=2, **DFLASH2_FORM)
    base, prev, hidden, _ = make_batch(3, 4, vocab, vocab, 6, seed=2)
    base.requires_grad_(True)
    target = base.detach().argmin(dim=-1)  # never in the top-k
    loss, stats = candidate_loss(base, head, prev, hidden, target, k, rule="replace_kth")
    assert float(stats.recall) == 0.0 and int(stats.num_trained) == 12
    loss.backward()
    assert head.markov_w2.weight.grad.abs().sum() > 0 and head.gate_proj.weight.grad.abs().sum() > 0
    assert base.grad[torch.arange(3)[:, None], torch.arange(4), target].lt(0).all()  # true token's logit pushed up
    empty, stats = candidate_loss(base, head, prev, hidden, target, k, rule="exclude")
    assert float(empty.detach()) == 0.0 and int(stats.num_trained) == 0 and empty.requires_grad
    loss_none, _ = candidate_loss(base, None, prev, None, target, vocab)  # no head, k = Vd: plain CE over the vocab
    torch.testing.assert_close(
        loss_none, torch.nn.functional.cross_entropy(base.reshape(-1, vocab), target.reshape(-1))
    )
    with pytest.raises(ValueError, match="rule"):
        candidate_loss(base, head, prev, hidden, target, k, rule="drop")


# ------------------------------------------------------------------------------------------------ conversion
def test_round_trip_through_candidate_selector_keeps_scores_identical():
    vocab, hidden_size, k = 13, 6, 4
    head = make_head(vocab, seed=3, **DFLASH2_FORM)
    state = to_candidate_selector(head)
    assert set(state) == {
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
        "candidate_selector.hidden_projection.weight",
    }
    assert state["candidate_selector.predecessor_codebook"].shape == (vocab, 4)
    assert state["candidate_selector.successor_codebook"].shape == (vocab, 4)
    assert state["candidate_selector.hidden_projection.weight"].shape == (4, hidden_size)
    restored = from_candidate_selector(state)
    form = restored.config
    assert (form.kind, form.gate_input, form.gate_activation) == ("gated", "hidden", "identity")
    base, prev, hidden, _ = make_batch(3, 5, vocab, vocab, hidden_size, seed=3)
    first_prev = prev[:, 0]
    candidates, scores = pair_scores(base, head, first_prev, hidden, k)
    restored_candidates, restored_scores = pair_scores(base, restored, first_prev, hidden, k)
    assert torch.equal(candidates, restored_candidates) and torch.equal(scores, restored_scores)
    # the DFlash-2 formula evaluated straight from the codebooks agrees with pair_scores
    direct_candidates, direct_scores = candidate_selector_scores(state, base, first_prev, hidden, k)
    assert torch.equal(direct_candidates, candidates)
    torch.testing.assert_close(direct_scores, scores, rtol=0, atol=1e-12)
    # exported tensors are copies: training the head afterwards does not change the export
    with torch.no_grad():
        head.markov_w1.weight.add_(1.0)
    assert not torch.equal(state["candidate_selector.predecessor_codebook"], head.markov_w1.weight)


def test_conversion_with_reduced_draft_vocab_and_other_key_layouts():
    vocab, draft_vocab, hidden_size, k = 17, 9, 5, 3
    d2t = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:draft_vocab].sort().values
    head = make_head(vocab, draft_vocab, hidden_size=hidden_size, seed=4, **DFLASH2_FORM)
    base, prev, hidden, _ = make_batch(3, 4, draft_vocab, vocab, hidden_size, seed=4)
    expected = pair_scores(base, head, prev[:, 0], hidden, k, d2t=d2t)[1]

    full = to_candidate_selector(head, d2t=d2t)  # DFlash-2 single vocabulary: successor rows over V
    assert full["candidate_selector.successor_codebook"].shape == (vocab, 4)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[d2t] = False
    assert torch.all(full["candidate_selector.successor_codebook"][outside] == 0)
    torch.testing.assert_close(candidate_selector_scores(full, base, prev[:, 0], hidden, k, d2t=d2t)[1], expected)
    restored = from_candidate_selector(full, d2t=d2t)
    assert restored.draft_vocab_size == draft_vocab
    assert torch.equal(pair_scores(base, restored, prev[:, 0], hidden, k, d2t=d2t)[1], expected)

    # nn.Embedding-style keys under an arbitrary checkpoint prefix are found automatically
    nested = {
        "model.candidate_selector.predecessor_codebook.weight": full["candidate_selector.predecessor_codebook"],
        "model.candidate_selector.successor_codebook.weight": full["candidate_selector.successor_codebook"],
        "model.candidate_selector.hidden_projection.weight": full["candidate_selector.hidden_projection.weight"],
        "model.layers.0.mlp.weight": torch.zeros(2, 2),
    }
    again = from_candidate_selector(nested, d2t=d2t)
    assert torch.equal(
        selector_decode(base, again, prev[:, 0], hidden, k, d2t=d2t),
        selector_decode(base, head, prev[:, 0], hidden, k, d2t=d2t),
    )


@pytest.mark.parametrize(
    "form",
    [
        {"kind": "vanilla"},
        {"kind": "gated", "gate_input": "hidden+prev", "gate_activation": "sigmoid"},
        {"kind": "gated", "gate_input": "hidden", "gate_activation": "sigmoid"},
        {"kind": "rnn"},
    ],
)
def test_only_the_dflash2_form_converts(form):
    with pytest.raises(ValueError, match="CandidateSelector form"):
        to_candidate_selector(make_head(seed=5, **form))


def test_missing_keys_are_reported():
    state = to_candidate_selector(make_head(seed=6, **DFLASH2_FORM))
    del state["candidate_selector.successor_codebook"]
    with pytest.raises(KeyError, match="successor_codebook"):
        from_candidate_selector(state)


@pytest.mark.parametrize("rule", ["replace_kth", "exclude"])
def test_candidate_loss_skips_true_tokens_outside_the_draft_vocab(rule):
    # a reduced draft vocabulary maps true tokens it lacks to -1: those slots are not trained, count as recall misses
    vocab, k = 9, 3
    head = make_head(vocab, seed=3, **DFLASH2_FORM)
    base, prev, hidden, _ = make_batch(2, 4, vocab, vocab, 6, seed=3)
    target = base.topk(k, dim=-1).indices[..., 0]  # every true token in the top-k ...
    outside = torch.tensor([[True, False, False, True], [False, False, True, False]])
    with_oov = torch.where(outside, torch.full_like(target, -1), target)  # ... except the ones the vocab lacks
    loss, stats = candidate_loss(base, head, prev, hidden, with_oov, k, rule=rule)
    expected, _ = candidate_loss(base, head, prev, hidden, target, k, ~outside, rule=rule)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)  # = the loss over the in-vocabulary slots alone
    assert int(stats.num_trained) == int((~outside).sum()) and int(stats.num_valid) == 8
    assert float(stats.recall) == pytest.approx(int((~outside).sum()) / 8)
