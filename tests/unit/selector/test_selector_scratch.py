"""The Selector's inference fast path (scratch buffers, staged top-k) returns exactly what the allocating path does.

- ``pair_scores`` / ``selector_walk`` without autograd (scratch buffers, ``selector.scratch``) are bitwise equal to the
  same calls with autograd on (plain allocating ops), for every pair form, float32 and float64, across shape changes,
  in inference mode and ``no_grad`` alternately, and in two threads at once; returned tensors never alias a buffer.
- the greedy walk's doubling scan (small batches) makes exactly the choices of the slot loop and of a plain Python
  walk, ties included (first maximum).
- ``candidate_topk`` equals a float64 brute force (a full sort) for every search plan, including exact ties across
  groups and at the k-th value, and is the same with and without scratch buffers.
"""

from __future__ import annotations

import threading

import pytest
import torch
from helpers.selector import make_head as make_test_head

from dspark_lightning.selector import candidate_topk, pair_scores, selector_walk, walk_pair_scores
from dspark_lightning.selector.topk import _topk_plan
from dspark_lightning.selector.walks import _SCAN_MAX_SCORES

FORMS = [
    ("vanilla", "hidden+prev", "sigmoid"),
    ("gated", "hidden+prev", "sigmoid"),
    ("gated", "hidden+prev", "identity"),
    ("gated", "hidden", "sigmoid"),
]
# (Vd, k) per search plan: torch.topk, strided groups with supergroups, strided without, contiguous chunks
PLAN_CASES = {
    "topk": [(300, 1), (300, 16)],
    "strided c2>1": [(32768, 1), (32768, 5), (32768, 16)],
    "strided c2=1": [(8192, 200)],
    "chunks": [(9000, 1), (9000, 5), (9000, 16)],
}


def make_head(form, vocab, dtype, seed):
    return make_test_head(form, vocab, rank=8, hidden_size=12, seed=seed, w2_std=0.5).to(dtype)


def make_inputs(n_rows, block, vocab, hidden_size, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(n_rows, block, vocab, generator=generator).to(dtype)
    hidden = torch.randn(n_rows, block, hidden_size, generator=generator).to(dtype)
    return base, torch.randint(0, vocab, (n_rows,), generator=generator), hidden


def allocating(fn, *args):
    """The plain path: with autograd on, no scratch buffer is used (the head is frozen, so no graph either)."""
    with torch.enable_grad():
        return fn(*args)


def test_every_plan_is_exercised():
    kinds = {name: {_topk_plan(vocab, k) for vocab, k in cases} for name, cases in PLAN_CASES.items()}
    assert kinds["topk"] == {None} and {plan[0] for plan in kinds["chunks"]} == {"chunks"}
    assert None not in kinds["strided c2>1"]  # no fallback to plain topk hides among them
    assert all(plan[0] == "strided" and plan[2] > 1 for plan in kinds["strided c2>1"])
    assert kinds["strided c2=1"] == {("strided", 16, 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("form", FORMS, ids=["vanilla", "gated-hp-sigmoid", "gated-hp-identity", "gated-hidden"])
def test_scratch_path_is_bitwise_the_allocating_path(form, dtype):
    cases = [(3, 4, 32768, 16), (2, 5, 9000, 16), (4, 3, 50, 7)]  # strided and chunked top-k, torch.topk
    for seed, (n_rows, block, vocab, k) in enumerate(cases):  # shapes change: the buffers are replaced
        head = make_head(form, vocab, dtype, seed)
        base, first_prev, hidden = make_inputs(n_rows, block, vocab, 12, dtype, seed)
        args = (base, head, first_prev, hidden, k)
        expected = allocating(pair_scores, *args)
        for context in (torch.inference_mode, torch.no_grad, torch.inference_mode):
            with context():
                candidates, scores = pair_scores(*args)
                assert torch.equal(candidates, expected[0]) and torch.equal(scores, expected[1])
                kept = scores.clone()
                walk = selector_walk(*args)
                again = pair_scores(base * 0.5, head, first_prev, hidden, k)  # overwrites every buffer
                assert torch.equal(scores, kept), "a returned tensor aliases a scratch buffer"
                assert not torch.equal(again[1], kept)
            plain = allocating(selector_walk, *args)
            assert torch.equal(walk.tokens, plain.tokens) and torch.equal(walk.path_scores, plain.path_scores)


def test_threads_do_not_share_buffers():
    form, dtype = FORMS[1], torch.float32
    jobs = []
    for seed, (vocab, n_rows) in enumerate([(8192, 3), (9000, 2)]):
        head = make_head(form, vocab, dtype, seed)
        inputs = make_inputs(n_rows, 4, vocab, 12, dtype, seed)
        jobs.append((head, inputs, allocating(pair_scores, inputs[0], head, inputs[1], inputs[2], 16)[1]))
    failures = []

    def run(head, inputs, expected):
        with torch.inference_mode():
            for _ in range(20):
                if not torch.equal(pair_scores(inputs[0], head, inputs[1], inputs[2], 16)[1], expected):
                    failures.append(head.draft_vocab_size)

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def brute_force_topk(logits, k):
    """The k largest values of each row by a full descending sort in float64."""
    return logits.double().sort(dim=-1, descending=True).values[..., :k]


@pytest.mark.parametrize(
    ("vocab", "k"), [case for cases in PLAN_CASES.values() for case in cases], ids=lambda value: str(value)
)
def test_candidate_topk_equals_brute_force_with_ties(vocab, k):
    generator = torch.Generator().manual_seed(vocab + k)
    distinct = torch.randn(4, 3, vocab, generator=generator)
    # few distinct values: exact ties inside and across groups, and at the k-th value
    tied = torch.randint(0, 6, (4, 3, vocab), generator=generator).float()
    tied[0, 0] = 0.0
    tied[0, 0, :: max(vocab // (2 * k), 1)] = 1.0  # more than k maxima spread over many groups
    for logits in (distinct, tied, tied.double()):
        values, indices = candidate_topk(logits, k)
        assert torch.equal(values.double(), brute_force_topk(logits, k))
        assert torch.equal(logits.gather(-1, indices), values)  # each index holds its value
        assert torch.equal(
            indices.sort(-1).values.diff(dim=-1) > 0, torch.ones_like(indices[..., 1:], dtype=torch.bool)
        )
        with torch.inference_mode():
            fast = candidate_topk(logits, k)
        plain = allocating(candidate_topk, logits, k)
        assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])  # ties too: same kernels, same order
    assert torch.equal(candidate_topk(distinct, k)[1], distinct.double().sort(-1, descending=True).indices[..., :k])


def python_greedy_walk(scores):
    """Choices [N, B] of the greedy walk, one row and slot at a time (first maximum on ties)."""
    n_rows, block, k, _ = scores.shape
    choices = torch.empty(n_rows, block, dtype=torch.long)
    for n in range(n_rows):
        previous = 0
        for t in range(block):
            row = scores[n, t, previous].tolist()
            previous = row.index(max(row))
            choices[n, t] = previous
    return choices


@pytest.mark.parametrize("block", [1, 2, 5, 16, 17])
def test_greedy_scan_equals_the_slot_loop_and_a_python_walk(block):
    k, n_rows = 16, 70
    generator = torch.Generator().manual_seed(block)
    for scores in (
        torch.randn(n_rows, block, k, k, generator=generator),
        torch.randint(0, 3, (n_rows, block, k, k), generator=generator).float(),  # ties: first maximum wins
    ):
        candidates = torch.randint(0, 100, (n_rows, block, k), generator=generator)
        assert scores.numel() > _SCAN_MAX_SCORES >= scores[:1].numel()  # the batch loops, each row alone scans
        batched = walk_pair_scores(candidates, scores, vocab_size=100)
        assert torch.equal(batched.choices, python_greedy_walk(scores))
        for n in range(n_rows):
            alone = walk_pair_scores(candidates[n : n + 1], scores[n : n + 1], vocab_size=100)
            for field in ("tokens", "choices", "path_scores", "probs"):
                assert torch.equal(getattr(alone, field), getattr(batched, field)[n : n + 1]), field
