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
    base, hidden = torch.randn(N, B, V), torch.randn(N, B, H)
    first_prev = torch.zeros(N, dtype=torch.long)
    sequential_walk(base, head, first_prev, hidden)  # every head has the sequential decode
    if "selector" in modes:
        selector_walk(base, head, first_prev, hidden, 4)
    else:  # only the path-dependent rnn head lacks a Selector walk (no head: parallel decoding only)
        assert head is None or head.is_path_dependent
        if head is not None:
            with pytest.raises(ValueError, match="path dependent"):
                selector_walk(base, head, first_prev, hidden, 4)
