"""Numbers as the cells of the studies' markdown tables."""

from __future__ import annotations

import math


def format_number(value, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; "n/a" for a value that was not measured (None) or is undefined (NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def format_mean_std(mean: float, std: float, n: int) -> str:
    """ "mean ± std" over ``n`` seeds; the mean alone for one seed, "n/a" for an undefined mean."""
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f} ± {std:.3f}" if n > 1 else f"{mean:.3f}"
