"""The verify forward's LM head: applied only to the rows verification reads, and bypassed (full logits) for a
target that post-processes its logits."""

from __future__ import annotations

import copy
import functools

import torch
from helpers.targets import bigram_setup, greedy_reference

from dspark_lightning.decoding import speculative_generate


def test_head_rows_are_only_those_verification_reads():
    model, target, drafter, _ = bigram_setup(noise=1.5)  # a noisy oracle: some drafts rejected, some accepted
    drafter.lm_head = copy.deepcopy(model.lm_head)  # same weights; the hook below then sees the target's calls only
    rows = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _o: rows.append(args[0].shape[:-1].numel()))
    try:
        prompt = torch.tensor([[1, 4, 2]])
        out, stats = speculative_generate(target, drafter, prompt, 24, mode="markov", eos_token_id=[])
    finally:
        hook.remove()
    assert torch.equal(out, greedy_reference(model, prompt, 24, []))
    read = sum(a + 1 for a in stats.accepted_per_step)  # rows up to and including the first rejection
    verified = sum(n + 1 for n in stats.verified_per_step)
    assert 0 < sum(stats.accepted_per_step) and read < verified  # the test sees both accepts and rejects
    assert sum(rows) == 2 + read  # + the prompt's last row and the prefill's check of the head against it


def test_target_that_post_processes_logits_keeps_its_own_logits():
    model, target, drafter, _ = bigram_setup(noise=0.5)
    prompt = torch.tensor([[3, 0, 7]])
    plain = greedy_reference(model, prompt, 20, [])
    bias = torch.zeros(model.config.vocab_size)
    bias[5] = 2.0  # moves the argmax on some tokens: logits != lm_head(final hidden state)
    forward = model.forward

    @functools.wraps(forward)
    def biased(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits + bias
        return out

    model.forward = biased
    reference = greedy_reference(model, prompt, 20, [])
    assert not torch.equal(reference, plain)  # the bias matters, so ignoring it would fail below
    for mode in ("parallel", "markov"):
        out, _ = speculative_generate(target, drafter, prompt, 20, mode=mode, eos_token_id=[])
        assert torch.equal(out, reference), mode
