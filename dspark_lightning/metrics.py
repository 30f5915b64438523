"""Acceptance and confidence-calibration metrics, exact under DDP (sums and counts, divided in ``compute()``).

At the package root because lightning/ (training), decoding/ and measuring/ (measured tau) share them. Definitions:
docs/design/design.md §7.1-§7.4, exactness: §7.5. Inputs are ``[Nb, B]`` (blocks x trained slots; flat ``[Nb*B]`` is
reshaped) with a validity mask; in the DFlash form pass slots 1..B-1 only (``block_size = B - 1``)."""

from __future__ import annotations

import torch
from torchmetrics import Metric

__all__ = [
    "AcceptanceMetrics",
    "ConfidenceCalibration",
    "acceptance_stats",
    "bin_sums",
    "block_tau",
    "greedy_block_tau",
    "prefix_length",
]


def _as_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    if x.dim() == 1:
        if x.numel() % block_size:
            raise ValueError(f"{x.numel()} rows do not split into blocks of {block_size}")
        return x.view(-1, block_size)
    if x.dim() != 2 or x.shape[1] != block_size:
        raise ValueError(f"expected [Nb, {block_size}] (or flat) input; got {tuple(x.shape)}")
    return x


def block_tau(alpha: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-block expected acceptance length 1 + Σ_k Π_{j≤k} α_j·m_j for ``[Nb, B]`` inputs (float32, or float64 for
    float64 ``alpha``)."""
    dtype = torch.promote_types(alpha.dtype, torch.float32)
    return 1.0 + torch.cumprod(alpha.to(dtype) * valid.to(dtype), dim=-1).sum(-1)


def prefix_length(matches: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row of a ``[N, B]`` bool tensor (int64)."""
    return matches.to(torch.long).cumprod(dim=-1).sum(dim=-1)


def greedy_block_tau(match: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-block greedy acceptance length 1 + longest prefix of valid, greedy-matched slots."""
    return 1.0 + prefix_length(match.bool() & valid.bool()).float()


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    num = num.float()
    den = den.float()
    return torch.where(den > 0, num / den.clamp_min(1e-30), torch.full_like(num, float("nan")))


class AcceptanceMetrics(Metric):
    """Accept rate, tau, greedy accuracy and greedy tau, overall and per slot (docs/design/design.md §7.1-§7.3)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, block_size: int, **kwargs):
        super().__init__(**kwargs)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        self.block_size = int(block_size)
        b = self.block_size
        self.add_state("alpha_sum", torch.zeros(b, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("greedy_sum", torch.zeros(b, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("valid_count", torch.zeros(b, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("tau_sum", torch.zeros((), dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("greedy_tau_sum", torch.zeros((), dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("num_blocks", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, alpha: torch.Tensor, greedy_match: torch.Tensor, valid_mask: torch.Tensor) -> None:
        b = self.block_size
        alpha = _as_blocks(alpha.detach(), b).float()
        match = _as_blocks(greedy_match.detach(), b).bool()
        valid = _as_blocks(valid_mask.detach(), b).bool()
        has = valid.any(-1)
        self.alpha_sum += (alpha * valid).sum(0)
        self.greedy_sum += (match & valid).sum(0)
        self.valid_count += valid.sum(0)
        self.tau_sum += block_tau(alpha, valid)[has].sum()
        self.greedy_tau_sum += greedy_block_tau(match, valid)[has].sum()
        self.num_blocks += has.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        n = self.valid_count.sum()
        return {
            "accept_rate": _safe_div(self.alpha_sum.sum(), n),
            "accept_rate_per_slot": _safe_div(self.alpha_sum, self.valid_count),
            "greedy_acc": _safe_div(self.greedy_sum.sum(), n),
            "greedy_acc_per_slot": _safe_div(self.greedy_sum, self.valid_count),
            "tau": _safe_div(self.tau_sum, self.num_blocks),
            "greedy_tau": _safe_div(self.greedy_tau_sum, self.num_blocks),
            "num_blocks": self.num_blocks.clone(),
        }


def bin_sums(
    predicted: torch.Tensor, observed: torch.Tensor, n_bins: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, sum of predicted, sum of observed) per equal-width bin of ``predicted`` in [0, 1] (flat inputs): the
    one binning behind the ECE, the calibration metric and the reliability diagrams."""
    idx = (predicted * n_bins).floor().long().clamp(0, n_bins - 1)
    zeros = torch.zeros(n_bins, dtype=predicted.dtype, device=predicted.device)
    count = torch.zeros(n_bins, dtype=torch.long, device=predicted.device).index_add_(0, idx, torch.ones_like(idx))
    return count, zeros.index_add(0, idx, predicted), zeros.index_add(0, idx, observed.to(predicted.dtype))


class ConfidenceCalibration(Metric):
    """Calibration of the confidence head's c_k against α_k and of prefix survival Π c against Π α."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, block_size: int, n_bins: int = 10, **kwargs):
        super().__init__(**kwargs)
        if block_size < 1 or n_bins < 1:
            raise ValueError(f"block_size and n_bins must be >= 1; got {block_size}, {n_bins}")
        self.block_size = int(block_size)
        self.n_bins = int(n_bins)
        b, k = self.block_size, self.n_bins
        f32 = torch.float32
        for name in ("abs_err_sum", "conf_sum", "alpha_sum", "prefix_bias_sum"):
            self.add_state(name, torch.zeros((), dtype=f32), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("prefix_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("slot_conf_sum", torch.zeros(b, dtype=f32), dist_reduce_fx="sum")
        self.add_state("slot_alpha_sum", torch.zeros(b, dtype=f32), dist_reduce_fx="sum")
        self.add_state("slot_count", torch.zeros(b, dtype=torch.long), dist_reduce_fx="sum")
        for prefix in ("bin", "pbin"):  # per-slot bins over c; prefix-survival bins over Π c
            self.add_state(f"{prefix}_count", torch.zeros(k, dtype=torch.long), dist_reduce_fx="sum")
            self.add_state(f"{prefix}_conf_sum", torch.zeros(k, dtype=f32), dist_reduce_fx="sum")
            self.add_state(f"{prefix}_obs_sum", torch.zeros(k, dtype=f32), dist_reduce_fx="sum")

    def _add_bins(self, prefix: str, conf: torch.Tensor, obs: torch.Tensor) -> None:
        count, conf_sum, obs_sum = bin_sums(conf, obs, self.n_bins)
        getattr(self, f"{prefix}_count").add_(count)
        getattr(self, f"{prefix}_conf_sum").add_(conf_sum)
        getattr(self, f"{prefix}_obs_sum").add_(obs_sum)

    def update(self, confidence: torch.Tensor, alpha: torch.Tensor, valid_mask: torch.Tensor) -> None:
        b = self.block_size
        c = _as_blocks(confidence.detach(), b).float().clamp(0.0, 1.0)
        a = _as_blocks(alpha.detach(), b).float().clamp(0.0, 1.0)
        valid = _as_blocks(valid_mask.detach(), b).bool()
        cv, av = c[valid], a[valid]
        self.abs_err_sum += (cv - av).abs().sum()
        self.conf_sum += cv.sum()
        self.alpha_sum += av.sum()
        self.count += valid.sum()
        self.slot_conf_sum += (c * valid).sum(0)
        self.slot_alpha_sum += (a * valid).sum(0)
        self.slot_count += valid.sum(0)
        self._add_bins("bin", cv, av)
        in_prefix = torch.cumprod(valid.long(), dim=-1).bool()
        pc = torch.cumprod(torch.where(valid, c, 1.0), dim=-1)[in_prefix]
        pa = torch.cumprod(torch.where(valid, a, 1.0), dim=-1)[in_prefix]
        self.prefix_bias_sum += (pc - pa).sum()
        self.prefix_count += in_prefix.sum()
        self._add_bins("pbin", pc, pa)

    def compute(self) -> dict[str, torch.Tensor]:
        n, pn = self.count, self.prefix_count
        return {
            "mean_abs_error": _safe_div(self.abs_err_sum, n),
            "mean_confidence": _safe_div(self.conf_sum, n),
            "mean_alpha": _safe_div(self.alpha_sum, n),
            "mean_confidence_per_slot": _safe_div(self.slot_conf_sum, self.slot_count),
            "mean_alpha_per_slot": _safe_div(self.slot_alpha_sum, self.slot_count),
            "prefix_survival_bias": _safe_div(self.prefix_bias_sum, pn),
            "slot_ece": _safe_div((self.bin_conf_sum - self.bin_obs_sum).abs().sum(), n),  # c_k vs α_k, every slot
            "prefix_ece": _safe_div((self.pbin_conf_sum - self.pbin_obs_sum).abs().sum(), pn),
            "reliability_confidence": _safe_div(self.pbin_conf_sum, self.pbin_count),
            "reliability_observed": _safe_div(self.pbin_obs_sum, self.pbin_count),
            "reliability_count": self.pbin_count.clone(),
        }


@torch.no_grad()
def acceptance_stats(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor, chunk_rows: int = 64
) -> dict[str, torch.Tensor]:
    """Acceptance statistics of draft vs target logits ``[N, B, Vd]`` (both softmaxed over Vd) under ``mask[N, B]``.

    Returns float tensors ``accept_rate`` (mean α over valid slots), ``tau`` (mean over blocks with ≥ 1 valid slot),
    ``greedy_acc`` (mean over valid slots), ``greedy_tau``, ``accept_rate_per_slot[B]`` and ``greedy_acc_per_slot[B]``.
    Computed in fp32 over chunks of ``chunk_rows`` blocks.
    """
    if draft_logits.shape != target_logits.shape or draft_logits.dim() != 3:
        raise ValueError(
            f"draft_logits and target_logits must both be [N, B, Vd]; got {tuple(draft_logits.shape)}, "
            f"{tuple(target_logits.shape)}"
        )
    n, b, _ = draft_logits.shape
    if tuple(mask.shape) != (n, b):
        raise ValueError(f"mask must be [{n}, {b}]; got {tuple(mask.shape)}")
    alpha = torch.empty(n, b, dtype=torch.float32, device=draft_logits.device)
    match = torch.empty(n, b, dtype=torch.bool, device=draft_logits.device)
    for s in range(0, n, chunk_rows):
        d = draft_logits[s : s + chunk_rows].float()
        t = target_logits[s : s + chunk_rows].float()
        alpha[s : s + chunk_rows] = torch.minimum(d.softmax(-1), t.softmax(-1)).sum(-1)
        match[s : s + chunk_rows] = d.argmax(-1) == t.argmax(-1)
    metric = AcceptanceMetrics(b).to(draft_logits.device)
    metric.update(alpha, match, mask.bool())
    out = metric.compute()
    keys = ("accept_rate", "tau", "greedy_acc", "greedy_tau", "accept_rate_per_slot", "greedy_acc_per_slot")
    return {k: out[k].float() for k in keys}
