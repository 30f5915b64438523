"""``equivalence_report``: coverage / agreement of the Selector walk vs the sequential decode, and teacher acceptance."""

from __future__ import annotations

import math

import pytest
import torch

from dspark_lightning.models import MarkovHead
from dspark_lightning.selector import equivalence_report, selector_decode, sequential_decode, teacher_acceptance

DTYPE = torch.float64


def make_case(seed=0, vocab=12, block=6, n_rows=10, hidden_size=6, kind="gated"):
    torch.manual_seed(seed)
    head = MarkovHead(verifier_vocab_size=vocab, draft_vocab_size=vocab, rank=4, hidden_size=hidden_size, kind=kind).to(
        DTYPE
    )
    with torch.no_grad():
        head.markov_w2.weight.normal_(0.0, 0.8)
    head.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(n_rows, block, vocab, generator=generator, dtype=DTYPE)
    hidden = torch.randn(n_rows, block, hidden_size, generator=generator, dtype=DTYPE)
    first_prev = torch.randint(0, vocab, (n_rows,), generator=generator)
    return head, base, first_prev, hidden


def test_full_k_covers_and_agrees_everywhere_and_coverage_grows_with_k():
    vocab, block = 12, 6
    for seed in range(5):
        head, base, first_prev, hidden = make_case(seed, vocab, block)
        ks = (1, 2, 3, 5, 8, vocab, 3 * vocab)
        report = equivalence_report(base, head, first_prev, hidden, ks=ks)
        assert report.effective_k == {1: 1, 2: 2, 3: 3, 5: 5, 8: 8, vocab: vocab, 3 * vocab: vocab}
        for k in (vocab, 3 * vocab):
            assert report.coverage[k] == 1.0 and report.agreement[k] == 1.0
            assert report.agreed_prefix[k] == block
            assert torch.all(report.agreement_per_slot[k] == 1.0)
        coverages = [report.coverage[k] for k in ks]
        assert coverages == sorted(coverages)  # C_t(k) is a subset of C_t(k') for k <= k'
        # every k against a direct computation: coverage = the sequential token in the base top-k, agreement = the
        # walk's token equal to it; the walk only emits candidates, so an agreeing slot is always a covered one
        sequential = sequential_decode(base, head, first_prev, hidden)
        for k in ks:
            covered = (base.topk(min(k, vocab), dim=-1).indices == sequential[..., None]).any(-1)
            agree = selector_decode(base, head, first_prev, hidden, k) == sequential
            assert report.coverage[k] == pytest.approx(covered.double().mean().item())
            assert report.agreement[k] == pytest.approx(agree.double().mean().item())
            assert not (agree & ~covered).any()
        assert report.num_blocks == 10 and report.num_valid_slots == 10 * block
        # one timing per walk (wall clock: only its presence is checked)
        assert set(report.time_walk_s) == set(ks) and math.isfinite(report.time_sequential_s)
    assert report.coverage[1] < 1.0  # the head changes some tokens: the diagnostics are not trivially 1


def test_report_statistics_match_a_direct_computation_with_mask_and_teacher():
    head, base, first_prev, hidden = make_case(seed=7)
    valid = torch.ones(10, 6, dtype=torch.bool)
    valid[0, 3:] = False
    valid[1] = False  # a block without valid slots is not counted
    teacher = torch.log_softmax(torch.randn(10, 6, 12, generator=torch.Generator().manual_seed(1), dtype=DTYPE) * 2, -1)
    report = equivalence_report(base, head, first_prev, hidden, teacher, ks=(2, 4), valid_mask=valid)
    sequential = sequential_decode(base, head, first_prev, hidden)
    walk = selector_decode(base, head, first_prev, hidden, 4)
    agree = (walk == sequential) & valid
    assert report.agreement[4] == pytest.approx(float(agree.sum() / valid.sum()))
    covered = (base.topk(4, dim=-1).indices == sequential[..., None]).any(-1) & valid
    assert report.coverage[4] == pytest.approx(float(covered.sum() / valid.sum()))
    prefixes = []
    for n in range(10):
        if not valid[n].any():
            continue
        length = 0
        while length < 6 and agree[n, length]:
            length += 1
        prefixes.append(length)
    assert report.agreed_prefix[4] == pytest.approx(sum(prefixes) / len(prefixes))
    assert report.num_blocks == 9

    # tau: 1 + sum_k prod_{j<=k} p_teacher(x_j) m_j ; greedy_tau: 1 + leading run of teacher-argmax matches
    taus, greedy_taus = [], []
    for n in range(10):
        if not valid[n].any():
            continue
        survive, tau, greedy, run = 1.0, 1.0, 1.0, True
        for t in range(6):
            p = float(teacher[n, t, sequential[n, t]].exp()) if valid[n, t] else 0.0
            survive *= p
            tau += survive
            run = run and bool(valid[n, t]) and int(sequential[n, t]) == int(teacher[n, t].argmax())
            greedy += float(run)
        taus.append(tau)
        greedy_taus.append(greedy)
    assert report.tau_sequential == pytest.approx(sum(taus) / len(taus))
    assert report.greedy_tau_sequential == pytest.approx(sum(greedy_taus) / len(greedy_taus))
    flat = report.to_flat_dict("val/selector/")
    assert {"val/selector/coverage@4", "val/selector/tau_walk@2", "val/selector/tau_sequential"} <= set(flat)


def test_teacher_that_agrees_with_the_draft_gives_full_greedy_tau():
    head, base, first_prev, hidden = make_case(seed=8)
    sequential = sequential_decode(base, head, first_prev, hidden)
    teacher = torch.log_softmax(torch.nn.functional.one_hot(sequential, 12).to(DTYPE) * 50.0, dim=-1)
    tau, greedy_tau = teacher_acceptance(sequential, teacher, torch.ones(10, 6, dtype=torch.bool))
    assert greedy_tau == 7.0 and tau == pytest.approx(7.0)
    # a teacher over a larger target vocabulary is indexed through d2t
    d2t = torch.arange(12) * 2
    wide = torch.full((10, 6, 24), -1e4, dtype=DTYPE).scatter(-1, d2t[sequential][..., None], 0.0)
    assert teacher_acceptance(sequential, wide, torch.ones(10, 6, dtype=torch.bool), d2t) == (pytest.approx(7.0), 7.0)


def test_rnn_head_is_refused():
    head, base, first_prev, hidden = make_case(seed=9, kind="rnn")
    with pytest.raises(ValueError, match="rnn"):
        equivalence_report(base, head, first_prev, hidden)
