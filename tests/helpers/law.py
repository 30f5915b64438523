"""Chi-square goodness of fit of sampled counts to an exact law, computed in float64.

scipy's `chisquare` refuses observed and expected totals that differ by more than ~1.5e-8 relative; expected counts
built in float32 miss that (scipy 1.17). Everything here is float64 and the expected counts are scaled to the
observed total only after checking that the exact probabilities sum to one.
"""

import torch
from scipy.stats import chisquare


def law_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0, min_bins: int = 2) -> float:
    """p-value of `counts` (draws per outcome) under `probs` (the exact law); bins expecting < `min_expected` pooled."""
    probs = probs.detach().to(torch.float64).flatten()
    counts = counts.detach().to(torch.float64).flatten()
    assert probs.shape == counts.shape, (probs.shape, counts.shape)
    assert abs(float(probs.sum()) - 1.0) < 1e-6, f"the exact law sums to {float(probs.sum())}, not 1"
    draws = counts.sum()
    expected = probs * draws
    small = expected < min_expected
    observed = counts[~small]
    expected = expected[~small]
    if small.any():
        observed = torch.cat((observed, counts[small].sum().view(1)))
        expected = torch.cat((expected, (probs[small].sum() * draws).view(1)))
    assert expected.numel() >= min_bins, "too few bins for a meaningful test"
    expected = expected * (draws / expected.sum())  # float64 rounding only: the law was checked to sum to one
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)
