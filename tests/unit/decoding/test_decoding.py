"""Speculative decoding: greedy and sampling losslessness, acceptance accounting, confidence scheduling.

The workhorse fixture is a *bigram target*: a random Qwen3 whose attention and MLP outputs are zeroed, so its
next-token distribution depends on the current token only (logits L[a]). A vanilla Markov head of rank V with
W1 = I and W2^T = L, on top of a backbone whose final norm is zeroed (base logits 0), is then an exact oracle for it:
markov-mode drafts are the target's own greedy chain, so every block must be accepted whole. Perturbing W2 gives a
drafter whose q differs from p, which is what the statistical losslessness tests need.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers.law import law_pvalue
from helpers.targets import bigram_setup, greedy_reference

from dspark_lightning.decoding import DecodeStats, scheduled_length, speculative_generate, verify_block


@pytest.mark.parametrize("mode", ["parallel", "markov", "selector"])
def test_greedy_output_equals_target_generate(mode):
    model, target, drafter, _ = bigram_setup(noise=0.7)
    g = torch.Generator().manual_seed(0)
    for trial in range(6):
        prompt = torch.randint(0, 11, (1, 3 + trial), generator=g)
        for max_new in (1, 5, 13):  # max_new_tokens before, inside and after a block boundary
            ref = greedy_reference(model, prompt, max_new, eos=[])
            out, stats = speculative_generate(target, drafter, prompt, max_new, mode=mode, k=4, eos_token_id=[])
            assert torch.equal(out, ref), (mode, trial, max_new)
            assert stats.new_tokens == max_new
        # an EOS token that appears inside the generation: both stop right after it
        chain = greedy_reference(model, prompt, 12, eos=[])[0, prompt.shape[1] :].tolist()
        eos = chain[5]
        ref = greedy_reference(model, prompt, 12, eos=[eos])
        out, _ = speculative_generate(target, drafter, prompt, 12, mode=mode, k=4, eos_token_id=[eos])
        assert torch.equal(out, ref), (mode, trial, "eos")


def test_oracle_drafter_has_full_blocks_accepted():
    model, target, drafter, _ = bigram_setup(noise=0.0)
    prompt = torch.tensor([[3, 1, 4]])
    out, stats = speculative_generate(target, drafter, prompt, 41, mode="markov", eos_token_id=[])
    assert torch.equal(out, greedy_reference(model, prompt, 41, eos=[]))
    B = drafter.block_size
    assert stats.accepted_per_step == [B] * 8  # 1 prefill token + 8 steps x (B drafted + 1 target token) = 41
    assert stats.tau == B + 1
    assert stats.accepted_rate_per_slot == [1.0] * B
    # the same oracle run as a Selector over the full vocabulary is identical
    _, sel = speculative_generate(target, drafter, prompt, 41, mode="selector", k=12, eos_token_id=[])
    assert sel.accepted_per_step == stats.accepted_per_step
    # pure DFlash mode ignores the head; its base logits are 0, so it drafts token 0 and is mostly rejected
    _, par = speculative_generate(target, drafter, prompt, 41, mode="parallel", eos_token_id=[])
    assert par.tau < stats.tau


def test_verify_rule_is_lossless_for_one_slot():
    """Draft d ~ q, verify against p: the emitted token is distributed as p (chi-square, 20k trials)."""
    g = torch.Generator().manual_seed(0)
    V = 6
    p_logits = torch.randn(2, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(1, V, generator=g) * 1.5, -1)
    q[0, 2] = 0.0  # q puts no mass on a token p likes: only reachable through the residual
    q = q / q.sum()
    p = torch.softmax(p_logits[0], -1)

    class NoVocab:
        d2t = None

    counts = torch.zeros(V)
    trials = 20_000
    for _ in range(trials):
        d = torch.multinomial(q[0], 1, generator=g)
        accepted, next_token = verify_block(d, q, p_logits, NoVocab, 1.0, g)
        counts[int(d) if accepted == 1 else next_token] += 1
    assert law_pvalue(counts, p) > 1e-3  # fixed seeds: deterministic; 1e-3 guards against a wrong rule only


def law_of_new_tokens_2_and_3(p: torch.Tensor, last: int) -> torch.Tensor:
    """Exact joint law of new tokens 2 and 3 of a bigram chain p[a, b] = P(next = b | current = a) whose prompt ends
    in ``last``: P(x2 = b, x3 = c) = Σ_a p[last, a]·p[a, b]·p[b, c] (x1 = a summed out), float64, flattened so that
    entry b·V + c is the pair (b, c)."""
    p = p.double()
    return torch.einsum("a,ab,bc->bc", p[last], p, p).flatten()


@pytest.mark.parametrize("mode, k", [("markov", 16), ("selector", 3)])
def test_sampling_output_distribution_equals_the_target(mode, k):
    """Joint law of new tokens 2 and 3 under speculative sampling == the bigram target's exact law (chi-square)."""
    V, T = 5, 1.0
    # two target layers: they are zeroed anyway (a bigram target), and each of the 1500 trials runs the target
    model, target, drafter, bigram = bigram_setup(vocab=V, block_size=2, noise=1.5, temperature_scale=1.0, num_layers=2)
    prompt = torch.tensor([[1, 3]])
    p = torch.softmax(bigram / T, -1)  # p[a, b] = P(next = b | current = a)
    exact = law_of_new_tokens_2_and_3(p, int(prompt[0, -1]))
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    counts = torch.zeros(V * V)
    trials = 1500
    for _ in range(trials):
        out, _ = speculative_generate(
            target, drafter, prompt, 3, mode=mode, k=k, temperature=T, generator=g, eos_token_id=[]
        )
        x2, x3 = out[0, -2:].tolist()
        counts[x2 * V + x3] += 1
    assert law_pvalue(counts, exact) > 1e-3  # cells expecting fewer than 5 draws are pooled into one


def test_confidence_scheduling_bounds_and_losslessness():
    survival = torch.tensor([0.9, 0.7, 0.4, 0.1])
    assert scheduled_length(survival, 4, 0.5, None) == 2
    assert scheduled_length(survival, 4, 0.95, None) == 1  # never fewer than one slot
    assert scheduled_length(survival, 4, 0.0, None) == 4  # never more than the block
    assert scheduled_length(None, 4, 0.5, None) == 4
    # cost model: (1 + cumsum a) / (t0 + t1 n) = [1.9/1.5, 2.6/2, 3.0/2.5, 3.1/3] -> n = 2
    assert scheduled_length(survival, 4, None, (1.0, 0.5)) == 2
    for threshold in (0.0, 0.3, 0.6, 0.99):
        for n_block in range(1, 5):
            n = scheduled_length(torch.rand(4), n_block, threshold, None)
            assert 1 <= n <= n_block

    model, target, drafter, _ = bigram_setup(noise=0.7)
    with torch.no_grad():  # a confidence head that is sure of slot 0 and unsure of later slots
        drafter.confidence_head.proj.bias.fill_(0.0)
        drafter.confidence_temperature.copy_(torch.tensor([0.1, 1.0, 1.0, 1.0]))
        drafter.confidence_head.proj.bias.fill_(0.5)
    prompt = torch.tensor([[2, 7, 1]])
    ref = greedy_reference(model, prompt, 20, eos=[])
    for threshold in (0.3, 0.6, 0.9):
        out, stats = speculative_generate(
            target, drafter, prompt, 20, mode="markov", confidence_threshold=threshold, eos_token_id=[]
        )
        assert torch.equal(out, ref)
        assert all(1 <= v <= drafter.block_size for v in stats.verified_per_step)
    _, low = speculative_generate(target, drafter, prompt, 20, mode="markov", confidence_threshold=0.3, eos_token_id=[])
    _, high = speculative_generate(
        target, drafter, prompt, 20, mode="markov", confidence_threshold=0.9, eos_token_id=[]
    )
    assert max(high.verified_per_step) < max(low.verified_per_step)


def test_clear_errors():
    _, target, drafter, _ = bigram_setup()
    with pytest.raises(ValueError, match="one sequence at a time"):
        speculative_generate(target, drafter, torch.zeros(2, 3, dtype=torch.long), 4, mode="markov")
    with pytest.raises(ValueError, match="unknown mode"):
        speculative_generate(target, drafter, torch.zeros(1, 3, dtype=torch.long), 4, mode="beam")


def test_exact_law_helper_matches_enumeration():
    """Guards the chi-square test's reference: the helper against an explicit sum over x1 for every (x2, x3)."""
    V, last = 5, 3
    p = torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2, -1)
    got = law_of_new_tokens_2_and_3(p, last)
    assert got.dtype == torch.float64 and got.shape == (V * V,)
    for b, c in itertools.product(range(V), repeat=2):
        expect = sum(p[last, a].item() * p[a, b].item() * p[b, c].item() for a in range(V))
        assert got[b * V + c].item() == pytest.approx(expect, rel=1e-12, abs=1e-15), (b, c)


def test_a_decode_whose_first_token_ends_it_has_no_tau():
    """The prompt forward's own token is EOS: no verify step ran, so tau is undefined (NaN), not 0, and a set's tau
    (total emitted / total forwards) leaves the prompt out."""
    model, target, drafter, _ = bigram_setup(noise=0.7)
    prompt = torch.tensor([[1, 3]])
    first = int(greedy_reference(model, prompt, 1, eos=[])[0, -1])
    out, stats = speculative_generate(target, drafter, prompt, 12, mode="markov", eos_token_id=[first])
    assert out[0, -1] == first and stats.target_forwards == 0 and math.isnan(stats.tau)
    _, other = speculative_generate(target, drafter, prompt, 12, mode="markov", eos_token_id=[])
    merged = DecodeStats.merge([stats, other])
    assert merged.tau == pytest.approx(sum(other.emitted_per_step) / other.target_forwards)
