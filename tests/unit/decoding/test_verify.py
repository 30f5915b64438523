"""``verify_block`` with a real draft vocabulary: Vd < V and a ``d2t`` that is not ``0..Vd-1``, as in every recipe.

A tiny bigram target (logits ``L[a]`` after token a) and a bigram drafter over the draft vocabulary drive a minimal
speculative decoder built on ``verify_block`` alone. Sampling: the law of the first emitted tokens must be the
target chain's exact float64 law (chi-square, fixed seeds: deterministic). Greedy: brute force over every block.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers.law import law_pvalue

from dspark_lightning.decoding import verify_block

V = 7
D2T = torch.tensor([1, 2, 4, 6])  # ascending target ids (a draft vocab file's layout); 0, 3 and 5 are not drafted


class DraftVocab:
    d2t = D2T


_g = torch.Generator().manual_seed(0)
TARGET = torch.randn(V, V, generator=_g) * 1.5  # row a: the target's logits after token a
Q = torch.softmax(torch.randn(V, len(D2T), generator=_g) * 1.5, -1)  # row a: the drafter's q after token a


def speculate(first: int, block: int, count: int, temperature: float, g: torch.Generator) -> list[int]:
    """The first ``count`` tokens after ``first``: draft ``block`` tokens from the drafter's chain (q over the draft
    vocabulary, drafts mapped to target ids by ``d2t``), verify them against the target rows of [x, d_1..d_n]."""
    out, current = [], first
    while len(out) < count:
        drafted, q, previous = [], [], current
        for _ in range(block):
            q_row = Q[previous]
            previous = int(D2T[torch.multinomial(q_row, 1, generator=g)])
            drafted.append(previous)
            q.append(q_row)
        rows = TARGET[[current] + drafted]
        accepted, token = verify_block(torch.tensor(drafted), torch.stack(q), rows, DraftVocab, temperature, g)
        out += drafted[:accepted] + [token]
        current = out[-1]
    return out[:count]


def exact_law(first: int, count: int, temperature: float) -> torch.Tensor:
    """P(x_1..x_count | first) of the target chain, float64, flattened with x_1 the most significant digit."""
    p = torch.softmax(TARGET.double() / temperature, -1)
    law = p[first]
    for _ in range(count - 1):
        last = torch.arange(law.numel()) % V  # the last token of each sequence so far
        law = (law[:, None] * p[last]).flatten()
    return law


def sampled_counts(block: int, count: int, temperature: float, trials: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    counts = torch.zeros(V**count)
    for _ in range(trials):
        tokens = speculate(3, block, count, temperature, g)
        counts[sum(t * V ** (count - 1 - i) for i, t in enumerate(tokens))] += 1
    return counts


def test_the_exact_law_is_the_chain():
    """The reference itself, checked by brute force: P(a, b) = p[first, a] * p[a, b]."""
    p = torch.softmax(TARGET.double() / 0.8, -1)
    law = exact_law(3, 2, 0.8).view(V, V)
    for a, b in itertools.product(range(V), repeat=2):
        assert float(law[a, b]) == pytest.approx(float(p[3, a] * p[a, b]), rel=1e-12)


@pytest.mark.parametrize(
    "block, count, trials",
    [(1, 1, 3000), (2, 3, 3000)],  # one slot; two and the bonus token after them (token 3)
)
def test_sampling_keeps_the_target_law_with_a_draft_vocabulary(block, count, trials):
    counts = sampled_counts(block, count, 0.8, trials)
    last = counts.view(-1, V).sum(0)  # the law of the last token
    assert last[[0, 3, 5]].sum() > trials / 10  # tokens the drafter cannot draft come out through the residual
    assert law_pvalue(counts, exact_law(3, count, 0.8)) > 1e-3  # fixed seeds: deterministic


def test_drafts_are_accepted_at_their_target_ids():
    """A drafter whose q equals the target's p on the draft vocabulary (and p has no mass elsewhere) is accepted
    every time: min(1, p(d) / q(d)) = 1 only if q is read at the drafted token's own target id."""
    p = torch.full((V,), -1e9)
    p[D2T] = torch.tensor([0.5, 1.0, -0.3, 0.2])
    q = torch.softmax(p[D2T], -1)
    g = torch.Generator().manual_seed(0)
    for draft_id, _ in itertools.product(range(len(D2T)), range(20)):
        drafted = D2T[[draft_id, (draft_id + 1) % len(D2T)]]
        accepted, _ = verify_block(drafted, q.expand(2, -1), p.expand(3, V), DraftVocab, 1.0, g)
        assert accepted == 2, draft_id


def test_greedy_accepts_the_longest_prefix_equal_to_the_target_argmax():
    """Every block of 1-3 drafts over the draft vocabulary: (#accepted, next) by brute force on the bigram target."""
    argmax = TARGET.argmax(-1).tolist()
    for block in (1, 2, 3):
        for draft_ids in itertools.product(range(len(D2T)), repeat=block):
            drafted = [int(D2T[i]) for i in draft_ids]
            chain = [3] + drafted
            expected = next(
                ((i, argmax[chain[i]]) for i in range(block) if argmax[chain[i]] != drafted[i]),
                (block, argmax[chain[block]]),
            )
            rows = TARGET[chain]
            assert verify_block(torch.tensor(drafted), None, rows, DraftVocab, 0.0, None) == expected, drafted


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_bf16_draft_distributions_are_verified_in_float32(logits_dtype):
    """A bf16 drafter's q (``decode --dtype bfloat16 --temperature T``), against the target's float32 logits (as the
    decode loop passes them) or bf16 ones, is verified exactly as its float32 values are: the same accepted prefix
    and token for every seed. (An index put of bf16 q into float32 p raised; bf16 arithmetic would round p / q.)"""
    rows = TARGET[[3, 1, 4, 6]].to(logits_dtype)
    q = Q[[3, 1, 4]].bfloat16()
    drafted = torch.tensor([1, 4, 6])
    for seed in range(200):
        low = verify_block(drafted, q, rows, DraftVocab, 0.8, torch.Generator().manual_seed(seed))
        full = verify_block(drafted, q.float(), rows.float(), DraftVocab, 0.8, torch.Generator().manual_seed(seed))
        assert low == full, seed


class FullVocab:
    d2t = None


def test_a_bf16_target_is_accepted_against_its_float64_probability():
    """Each case puts the target's probability of the drafted token 1e-4 (relative) above or below the acceptance
    threshold u q: u is the slot's uniform draw (the generator's first), q = 1/2, and a temperature solved in float64
    sets p = sigmoid(-1 / T) from the bf16 logits [-1, 0]. Accepted iff p / q > u in float64, for every case;
    bf16 probabilities (2^-9 relative rounding) decide 133 of the 291 cases the other way (the mutation
    verify-bf16-probabilities)."""
    logits = torch.tensor([[-1.0, 0.0], [0.0, 0.0]], dtype=torch.bfloat16)  # slot 1's row: the bonus token's
    q = torch.tensor([[0.5, 0.5]])
    wrong = []
    for seed in range(300):
        u = float(torch.rand((), generator=torch.Generator().manual_seed(seed)))
        side = 1.0 if seed % 2 else -1.0
        p = 0.5 * u * (1.0 + side * 1e-4)  # the float64 probability this case gives the drafted token 0
        if not 1e-3 < p < 0.49:
            continue
        temperature = -1.0 / (torch.tensor(p, dtype=torch.float64).logit().item())  # sigmoid(-1 / T) = p
        accepted, _ = verify_block(
            torch.tensor([0]), q, logits, FullVocab, temperature, torch.Generator().manual_seed(seed)
        )
        if accepted != int(p / 0.5 > u):
            wrong.append(seed)
    assert wrong == []
