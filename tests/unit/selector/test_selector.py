"""Exactness of the Selector view of the Markov head (float64, random weights, many seeds).

- k = Vd: the Selector walk decodes exactly the sequential (full-vocabulary) Markov decode, token for token.
- ``pair_scores`` entries are the head's own logits restricted to the candidates (brute force over (t, i, j)); a gated
  head whose gate is fixed at 1 is the vanilla head.
- Sampling: with k = Vd the walk and the sequential decode both draw block sequences from the exact joint
  distribution (chi-square goodness-of-fit against brute-force enumeration, significance level 0.001, fixed
  generators so the outcome is deterministic); with k < Vd the walk draws from the renormalised top-k walk.
- The rnn head has no pair scores; its sequential decode matches a hand-written recursion.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers.law import law_pvalue
from helpers.selector import make_head

from dspark_lightning.selector import (
    candidate_topk,
    pair_scores,
    precompute_prev_gate_table,
    selector_decode,
    selector_walk,
    sequential_decode,
    sequential_walk,
)

DTYPE = torch.float64
SIGNIFICANCE = 1e-3  # chi-square tests reject at p < 0.001 (deterministic: fixed generators)
# (kind, gate_input, gate_activation): vanilla and the four gate forms of docs/design/design.md §4.2.
PAIR_FORMS = [
    ("vanilla", "hidden+prev", "sigmoid"),
    ("gated", "hidden+prev", "sigmoid"),
    ("gated", "hidden", "identity"),
    ("gated", "hidden", "sigmoid"),
    ("gated", "hidden+prev", "identity"),
]
FORM_IDS = [
    "vanilla",
    "gated-hidden+prev-sigmoid",
    "gated-hidden-identity",
    "gated-hidden-sigmoid",
    "gated-hp-identity",
]


def make_block(n_rows, block, draft_vocab, vocab, hidden_size, seed, logit_std=1.5):
    generator = torch.Generator().manual_seed(1000 + seed)
    base = torch.randn(n_rows, block, draft_vocab, generator=generator, dtype=DTYPE) * logit_std
    hidden = torch.randn(n_rows, block, hidden_size, generator=generator, dtype=DTYPE)
    first_prev = torch.randint(0, vocab, (n_rows,), generator=generator)
    return base, first_prev, hidden


def make_d2t(vocab, draft_vocab, seed=0):
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values


# ------------------------------------------------------------------------------------------------ k = Vd exactness
@pytest.mark.parametrize("form", PAIR_FORMS, ids=FORM_IDS)
def test_full_k_walk_equals_sequential_decode(form):
    vocab, block, hidden_size = 11, 6, 6
    head_changed_something = False
    for seed in range(20):
        head = make_head(form, vocab, hidden_size=hidden_size, seed=seed)
        base, first_prev, hidden = make_block(8, block, vocab, vocab, hidden_size, seed)
        sequential = sequential_decode(base, head, first_prev, hidden)
        assert torch.equal(selector_decode(base, head, first_prev, hidden, vocab), sequential), f"seed {seed}"
        assert torch.equal(selector_decode(base, head, first_prev, hidden, 10 * vocab), sequential)  # k clamps
        head_changed_something |= not torch.equal(sequential, base.argmax(-1))
    assert head_changed_something, "the Markov bias never changed a token: the test would be vacuous"


@pytest.mark.parametrize("form", PAIR_FORMS[:3], ids=FORM_IDS[:3])
def test_full_k_walk_equals_sequential_decode_with_reduced_draft_vocab(form):
    vocab, draft_vocab, hidden_size = 17, 9, 5
    d2t = make_d2t(vocab, draft_vocab)
    for seed in range(10):
        head = make_head(form, vocab, draft_vocab, hidden_size=hidden_size, seed=seed)
        base, first_prev, hidden = make_block(6, 5, draft_vocab, vocab, hidden_size, seed)
        sequential = sequential_decode(base, head, first_prev, hidden, d2t=d2t)
        walk = selector_decode(base, head, first_prev, hidden, draft_vocab, d2t=d2t)
        assert torch.equal(walk, sequential), f"seed {seed}"
        assert int(walk.max()) < draft_vocab


def test_selector_walk_reports_greedy_point_mass():
    form = PAIR_FORMS[1]
    head = make_head(form)
    base, first_prev, hidden = make_block(4, 5, 11, 11, 6, seed=3)
    walk = selector_walk(base, head, first_prev, hidden, 4)
    assert walk.candidates.shape == (4, 5, 4) and walk.probs.shape == (4, 5, 4)
    assert torch.equal(walk.candidates.gather(-1, walk.choices[..., None]).squeeze(-1), walk.tokens)
    full = walk.full_probs()
    assert full.shape == (4, 5, 11)
    assert torch.equal(full.argmax(-1), walk.tokens) and torch.all(full.sum(-1) == 1)


# ------------------------------------------------------------------------------------------------ pair scores
@pytest.mark.parametrize("vocab", [7, 2048, 8192, 12288, 32768, 151936 // 4, 8191])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_candidate_topk_is_exact(vocab, k):
    logits = torch.randn(3, 2, vocab, generator=torch.Generator().manual_seed(vocab + k))
    logits[0, 0, :: max(vocab // 5, 1)] += 6.0  # several large entries, some in the same chunk
    values, indices = candidate_topk(logits, k)
    expected = logits.topk(min(k, vocab), dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
    ties = torch.zeros(2, 16384)
    ties[:, 100:140] = 1.0  # exact ties: same values, valid distinct indices
    tie_values, tie_indices = candidate_topk(ties, 16)
    assert torch.all(tie_values == 1.0) and torch.all(ties.gather(-1, tie_indices) == 1.0)
    assert all(len(set(row.tolist())) == 16 for row in tie_indices)


def brute_force_pair_scores(base, head, first_prev, hidden, candidates, d2t=None):
    """scores[n, t, i, j] from the head's full teacher-forced logits, one (n, t, i) at a time."""
    n_rows, block, k = candidates.shape
    scores = torch.empty(n_rows, block, k, k, dtype=base.dtype)
    for n, t, i in itertools.product(range(n_rows), range(block), range(k)):
        if t == 0:
            prev = first_prev[n]
        else:
            prev = candidates[n, t - 1, i] if d2t is None else d2t[candidates[n, t - 1, i]]
        logits = base[n, t] + head.block_bias(prev.view(1, 1), hidden[n, t].view(1, 1, -1))[0, 0]
        scores[n, t, i] = logits[candidates[n, t]]
    return scores


@pytest.mark.parametrize("form", PAIR_FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("reduced_vocab", [False, True], ids=["Vd=V", "Vd<V"])
def test_pair_scores_equal_head_logits_restricted_to_candidates(form, reduced_vocab):
    vocab, draft_vocab, hidden_size, k = 13, (7 if reduced_vocab else 13), 5, 3
    d2t = make_d2t(vocab, draft_vocab, seed=1) if reduced_vocab else None
    head = make_head(form, vocab, draft_vocab, hidden_size=hidden_size, seed=4)
    base, first_prev, hidden = make_block(2, 3, draft_vocab, vocab, hidden_size, seed=4)
    candidates, scores = pair_scores(base, head, first_prev, hidden, k, d2t=d2t)
    assert candidates.shape == (2, 3, k) and scores.shape == (2, 3, k, k)
    assert torch.equal(candidates, base.topk(k, dim=-1).indices)
    expected = brute_force_pair_scores(base, head, first_prev, hidden, candidates, d2t)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-12)
    if form[:2] == ("gated", "hidden+prev"):
        table = precompute_prev_gate_table(head)
        _, cached = pair_scores(base, head, first_prev, hidden, k, d2t=d2t, prev_gate_table=table)
        torch.testing.assert_close(cached, expected, rtol=0, atol=1e-12)


def test_default_gate_table_is_cached_and_follows_weight_changes():
    from dspark_lightning.selector.pairs import _cached_prev_gate_table

    head = make_head(PAIR_FORMS[1], seed=21)
    base, first_prev, hidden = make_block(3, 4, 11, 11, 6, seed=21)
    with torch.no_grad():
        _, default = pair_scores(base, head, first_prev, hidden, 5)  # no autograd: the cached table is used
        table = _cached_prev_gate_table(head)
        assert table is _cached_prev_gate_table(head)  # built once
        _, explicit = pair_scores(base, head, first_prev, hidden, 5, prev_gate_table=precompute_prev_gate_table(head))
        _, per_predecessor = pair_scores(base, head, first_prev, hidden, 5, prev_gate_table=False)
        assert torch.equal(default, explicit)
        torch.testing.assert_close(default, per_predecessor, rtol=0, atol=1e-12)
        head.gate_proj.weight.mul_(2.0)  # an in-place update (as an optimizer step) invalidates the table
        assert _cached_prev_gate_table(head) is not table
        _, changed = pair_scores(base, head, first_prev, hidden, 5)
        torch.testing.assert_close(
            changed, pair_scores(base, head, first_prev, hidden, 5, prev_gate_table=False)[1], rtol=0, atol=1e-12
        )


def test_pair_scores_are_differentiable_and_match_the_inference_path():
    head = make_head(PAIR_FORMS[1], seed=12).requires_grad_(True)
    base, first_prev, hidden = make_block(3, 4, 11, 11, 6, seed=12)
    _, scores = pair_scores(base, head, first_prev, hidden, 5)
    scores.sum().backward()
    assert head.gate_proj.weight.grad.abs().sum() > 0 and head.markov_w1.weight.grad.abs().sum() > 0
    with torch.inference_mode():
        _, inference_scores = pair_scores(base, head, first_prev, hidden, 5)
    torch.testing.assert_close(scores.detach(), inference_scores, rtol=0, atol=1e-12)


def test_gate_fixed_at_one_is_the_vanilla_head():
    gated = make_head(("gated", "hidden+prev", "sigmoid"), seed=5)
    vanilla = make_head(PAIR_FORMS[0], seed=6)
    with torch.no_grad():
        gated.gate_proj.weight.zero_()
        gated.gate_proj.bias.fill_(40.0)  # sigmoid(40) == 1.0 exactly in float64
        vanilla.markov_w1.weight.copy_(gated.markov_w1.weight)
        vanilla.markov_w2.weight.copy_(gated.markov_w2.weight)
    base, first_prev, hidden = make_block(5, 4, 11, 11, 6, seed=5)
    assert torch.equal(
        pair_scores(base, gated, first_prev, hidden, 5)[1], pair_scores(base, vanilla, first_prev, hidden, 5)[1]
    )
    assert torch.equal(gated.block_bias(base.argmax(-1), hidden), vanilla.block_bias(base.argmax(-1), hidden))
    assert torch.equal(
        sequential_decode(base, gated, first_prev, hidden), sequential_decode(base, vanilla, first_prev, hidden)
    )


def test_no_head_scores_are_base_logits():
    base, first_prev, hidden = make_block(3, 4, 11, 11, 6, seed=7)
    candidates, scores = pair_scores(base, None, first_prev, hidden, 4)
    assert torch.equal(scores, base.gather(-1, candidates)[:, :, None, :].expand(3, 4, 4, 4))
    assert torch.equal(selector_decode(base, None, first_prev, None, 4), base.argmax(-1))
    assert torch.equal(sequential_decode(base, None, first_prev, None), base.argmax(-1))


def test_input_errors_are_clear():
    head = make_head(PAIR_FORMS[1], vocab=13, draft_vocab=7)
    base, first_prev, hidden = make_block(2, 3, 7, 13, 6, seed=0)
    with pytest.raises(ValueError, match="d2t"):
        pair_scores(base, head, first_prev, hidden, 3)
    with pytest.raises(ValueError, match="hidden"):
        pair_scores(base, head, first_prev, None, 3, d2t=make_d2t(13, 7))
    with pytest.raises(ValueError, match="temperature"):
        selector_decode(base, None, first_prev, None, 3, temperature=-1.0)
    with pytest.raises(ValueError, match="k must be"):
        pair_scores(base, None, first_prev, None, 0)


# ------------------------------------------------------------------------------------------------ rnn
def manual_rnn_decode(base, head, first_prev, hidden):
    """Greedy rnn decode written from the docs/design/design.md §4.3 equations with the raw weights."""
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    wj, bj = head.joint_proj.weight, head.joint_proj.bias
    rank = head.config.rank
    tokens = torch.empty(base.shape[:2], dtype=torch.long)
    for n in range(base.shape[0]):
        state = torch.zeros(rank, dtype=base.dtype)
        prev = int(first_prev[n])
        for t in range(base.shape[1]):
            joint = wj @ torch.cat((state, w1[prev], hidden[n, t])) + bj
            gate, cand, out = joint[:rank], joint[rank : 2 * rank], joint[2 * rank :]
            keep = 1.0 / (1.0 + torch.exp(-gate))
            state = keep * state + (1.0 - keep) * torch.tanh(cand)
            tokens[n, t] = int(torch.argmax(base[n, t] + w2 @ torch.tanh(out)))
            prev = int(tokens[n, t])
    return tokens


def test_rnn_head_has_no_pair_scores_but_decodes_sequentially():
    head = make_head(("rnn", "hidden+prev", "sigmoid"), seed=8)
    base, first_prev, hidden = make_block(4, 5, 11, 11, 6, seed=8)
    with pytest.raises(ValueError, match="path dependent"):
        pair_scores(base, head, first_prev, hidden, 4)
    with pytest.raises(ValueError, match="sequential_decode"):
        selector_decode(base, head, first_prev, hidden, 4)
    for seed in range(5):
        head = make_head(("rnn", "hidden+prev", "sigmoid"), seed=seed)
        base, first_prev, hidden = make_block(4, 5, 11, 11, 6, seed=seed)
        expected = manual_rnn_decode(base, head, first_prev, hidden)
        assert torch.equal(sequential_decode(base, head, first_prev, hidden), expected)


# ------------------------------------------------------------------------------------------------ sampling
def exact_joint_probs(base, head, first_prev, hidden, temperature, k=None):
    """Probability of every sequence in [0, Vd)^B for one block (row 0), by enumeration.

    k=None: the sequential Markov decode (softmax over all of Vd). k: the Selector walk over C_t = top-k(U_t).
    """
    block, vocab = base.shape[1:]
    sequences = torch.tensor(list(itertools.product(range(vocab), repeat=block)))  # [Vd^B, B]
    count = sequences.shape[0]
    prev = torch.cat((first_prev[:1].expand(count, 1), sequences[:, :-1]), dim=1)
    logits = base[:1].expand(count, -1, -1) + head.block_bias(prev, hidden[:1].expand(count, -1, -1))
    if k is not None:
        outside = torch.ones_like(logits, dtype=torch.bool)
        outside.scatter_(-1, base[:1].topk(k, dim=-1).indices.expand(count, -1, -1), False)
        logits = logits.masked_fill(outside, float("-inf"))
    logprobs = torch.log_softmax(logits / temperature, dim=-1).gather(-1, sequences[..., None]).squeeze(-1)
    return logprobs.sum(dim=1).exp()


def chisquare_pvalue(counts, probs, draws):
    """Goodness of fit of observed sequence counts to exact probabilities (float64; bins expecting < 5 pooled)."""
    assert int(counts.sum()) == draws
    return law_pvalue(counts, probs, min_bins=8)


def sequence_counts(tokens, vocab):
    codes = (tokens * vocab ** torch.arange(tokens.shape[1] - 1, -1, -1)).sum(dim=1)
    return torch.bincount(codes, minlength=vocab ** tokens.shape[1])


@pytest.mark.parametrize("form", [PAIR_FORMS[1], PAIR_FORMS[2]], ids=[FORM_IDS[1], FORM_IDS[2]])
def test_sampling_walk_draws_the_sequential_distribution(form):
    vocab, block, draws, temperature = 4, 3, 20_000, 0.8
    head = make_head(form, vocab, hidden_size=4, seed=9, w2_std=0.4)
    base, first_prev, hidden = make_block(1, block, vocab, vocab, 4, seed=9, logit_std=0.6)
    exact = exact_joint_probs(base, head, first_prev, hidden, temperature)
    assert float(exact.sum()) == pytest.approx(1.0)
    rows = (base.expand(draws, -1, -1), head, first_prev.expand(draws), hidden.expand(draws, -1, -1))

    walk = selector_decode(*rows, vocab, temperature=temperature, generator=torch.Generator().manual_seed(1))
    sequential = sequential_decode(*rows, temperature=temperature, generator=torch.Generator().manual_seed(2))
    for tokens in (walk, sequential):
        assert chisquare_pvalue(sequence_counts(tokens, vocab), exact, draws) > SIGNIFICANCE

    # the test has power: the same samples are rejected against the distribution without the Markov bias
    base_only = torch.softmax(base[0] / temperature, dim=-1)
    independent = torch.tensor(
        [
            float(base_only[0, a] * base_only[1, b] * base_only[2, c])
            for a, b, c in itertools.product(range(vocab), repeat=3)
        ]
    )
    assert chisquare_pvalue(sequence_counts(walk, vocab), independent, draws) < SIGNIFICANCE


def test_sampling_walk_with_small_k_draws_the_renormalised_top_k_walk():
    vocab, block, draws, temperature, k = 4, 3, 20_000, 1.0, 3
    head = make_head(PAIR_FORMS[1], vocab, hidden_size=4, seed=10, w2_std=0.4)
    base, first_prev, hidden = make_block(1, block, vocab, vocab, 4, seed=10, logit_std=0.6)
    exact = exact_joint_probs(base, head, first_prev, hidden, temperature, k=k)
    rows = (base.expand(draws, -1, -1), head, first_prev.expand(draws), hidden.expand(draws, -1, -1))
    walk = selector_walk(*rows, k, temperature=temperature, generator=torch.Generator().manual_seed(3))
    counts = sequence_counts(walk.tokens, vocab)
    support = exact > 0
    assert int(support.sum()) == k**block and int(counts[~support].sum()) == 0
    assert chisquare_pvalue(counts[support], exact[support], draws) > SIGNIFICANCE
    # the reported q is the distribution each token was drawn from, along the walked path
    prev = torch.cat((first_prev.expand(draws)[:, None], walk.tokens[:, :-1]), dim=1)[:50]
    logits = base.expand(50, -1, -1) + head.block_bias(prev, hidden.expand(50, -1, -1))
    torch.testing.assert_close(walk.probs[:50], torch.softmax(logits.gather(-1, walk.candidates[:50]), dim=-1))


def test_reported_distributions_follow_the_walked_path():
    form, vocab, temperature = PAIR_FORMS[2], 11, 0.7
    head = make_head(form, vocab, seed=11)
    base, first_prev, hidden = make_block(6, 5, vocab, vocab, 6, seed=11)
    walk = selector_walk(
        base, head, first_prev, hidden, vocab, temperature=temperature, generator=torch.Generator().manual_seed(0)
    )
    seq = sequential_walk(
        base, head, first_prev, hidden, temperature=temperature, generator=torch.Generator().manual_seed(0)
    )
    for tokens, q in ((walk.tokens, walk.full_probs()), (seq.tokens, seq.probs)):
        prev = torch.cat((first_prev[:, None], tokens[:, :-1]), dim=1)
        expected = torch.softmax((base + head.block_bias(prev, hidden)) / temperature, dim=-1)
        torch.testing.assert_close(q, expected, rtol=0, atol=1e-12)
    assert torch.equal(seq.probs.sum(-1) > 0, torch.ones(6, 5, dtype=torch.bool))


def test_a_sampled_walk_over_bf16_logits_samples_from_one_float32_distribution():
    """q is what the draft samples from and what verification divides by: over a bf16 drafter's logits it is the
    float32 softmax of their values (normalised, the same draws for the same seed), not a bf16 one."""
    logits = (torch.randn(2, 4, 50, generator=torch.Generator().manual_seed(0)) * 2).bfloat16()
    first = torch.zeros(2, dtype=torch.long)
    low = sequential_walk(logits, None, first, None, temperature=0.7, generator=torch.Generator().manual_seed(1))
    full = sequential_walk(
        logits.float(), None, first, None, temperature=0.7, generator=torch.Generator().manual_seed(1)
    )
    assert low.probs.dtype == torch.float32 and torch.equal(low.tokens, full.tokens)
    assert torch.allclose(low.probs, full.probs) and torch.allclose(low.probs.sum(-1), torch.ones(2, 4))
