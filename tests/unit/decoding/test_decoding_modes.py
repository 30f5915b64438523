"""supported_modes(head) agrees with what the Selector machinery accepts for each head."""

import pytest
import torch

from dspark_lightning.decoding import MODES, supported_modes
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector import selector_walk, sequential_walk


@pytest.mark.parametrize("kind", [None, "vanilla", "gated", "rnn"])
def test_supported_modes_match_the_walks_each_head_can_run(kind):
    V, R, H, N, B = 12, 4, 8, 2, 3
    head = None if kind is None else MarkovHead(V, V, R, H, kind=kind)
    modes = supported_modes(head)
    assert set(modes) <= set(MODES) and modes == tuple(m for m in MODES if m in modes)  # MODES order
    assert "parallel" in modes and ("markov" in modes) == (head is not None)
    generator = torch.Generator().manual_seed(0)
    if head is not None:  # weights far from their (near-zero-bias) initialisation: the bias changes the walk
        for parameter in head.parameters():
            parameter.data = torch.randn(parameter.shape, generator=generator)
    base, hidden = torch.randn(N, B, V, generator=generator), torch.randn(N, B, H, generator=generator)
    first_prev = torch.zeros(N, dtype=torch.long)
    tokens = sequential_walk(base, head, first_prev, hidden).tokens  # every head has the sequential decode
    assert tokens.shape == (N, B) and tokens.dtype == torch.long and 0 <= tokens.min() and tokens.max() < V
    assert (head is None) == torch.equal(tokens, base.argmax(-1))  # a head's bias moves the greedy walk here
    if "selector" in modes:
        # with every token a candidate (k = V) the Selector's walk is the sequential greedy decode
        assert torch.equal(selector_walk(base, head, first_prev, hidden, V).tokens, tokens)
        assert selector_walk(base, head, first_prev, hidden, 4).tokens.shape == (N, B)
    else:  # only the path-dependent rnn head lacks a Selector walk (no head: parallel decoding only)
        assert head is None or head.is_path_dependent
        if head is not None:
            with pytest.raises(ValueError, match="path dependent"):
                selector_walk(base, head, first_prev, hidden, 4)
