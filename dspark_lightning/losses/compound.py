"""Draft-model losses: the compound loss over the terms of :mod:`dspark_lightning.losses.terms`, and the confidence BCE.

Conventions, the weighted masked mean, the chunked custom Function and its memory, the confidence loss:
docs/design/losses.md §1, §3, §5, §8. Position weights and D-PACE live in
:mod:`dspark_lightning.losses.position_weighting`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dspark_lightning.errors import OptionError
from dspark_lightning.losses.position_weighting import POSITION_WEIGHTINGS, dpace_weights
from dspark_lightning.losses.terms import (
    DEFAULT_LK_ETA,
    DEFAULT_NLA_ALPHA_MIN,
    LOSS_NAMES,
    chunk_terms,
    reference_terms,
    validate_loss_options,
    validate_spec,
)

__all__ = ["LossOutput", "compound_loss", "compound_loss_reference", "confidence_loss"]


@dataclass
class LossOutput:
    """Result of :func:`compound_loss`. Per-row fields have the leading shape of ``draft_logits``."""

    loss: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    alpha: torch.Tensor | None = None
    greedy_match: torch.Tensor | None = None
    draft_argmax: torch.Tensor | None = None
    teacher_argmax: torch.Tensor | None = None
    weights: torch.Tensor | None = None  # effective per-row weight W_r (detached, before division by Σ W)


# ----------------------------------------------------------------------------------------------------------------------
# inputs


def _flatten_inputs(
    draft_logits, teacher_logprobs, row_weights, valid_mask, block_size, position_weighting, teacher_rows=None
):
    if teacher_rows is not None:  # a table of distinct rows [U, Vd] and the row of it each logits row reads
        if teacher_rows.numel() != math.prod(draft_logits.shape[:-1]) or teacher_logprobs.dim() != 2:
            raise ValueError(
                f"teacher_rows {tuple(teacher_rows.shape)} must hold one row index per draft row of "
                f"{tuple(draft_logits.shape)}, into a [U, Vd] teacher table; got {tuple(teacher_logprobs.shape)}"
            )
        if teacher_logprobs.shape[-1] != draft_logits.shape[-1]:
            raise ValueError(f"teacher table {tuple(teacher_logprobs.shape)} and draft_logits differ in Vd")
    elif draft_logits.shape != teacher_logprobs.shape:
        raise ValueError(
            f"draft_logits {tuple(draft_logits.shape)} and teacher_logprobs {tuple(teacher_logprobs.shape)} differ"
        )
    if draft_logits.dim() < 2:
        raise ValueError(f"draft_logits must be [..., Vd] with at least 2 dims; got {tuple(draft_logits.shape)}")
    if position_weighting not in POSITION_WEIGHTINGS:
        raise OptionError(
            f"position_weighting must be one of {', '.join(POSITION_WEIGHTINGS)}; got {position_weighting!r}"
        )
    lead = draft_logits.shape[:-1]
    vd = draft_logits.shape[-1]
    n = math.prod(lead)
    dev = draft_logits.device
    w = torch.ones((), device=dev) if row_weights is None else row_weights.detach().to(device=dev)
    m = torch.ones((), device=dev) if valid_mask is None else valid_mask.detach().to(device=dev)
    cd = _compute_dtype(draft_logits)

    def rows(x):  # same number of rows in another layout ([Nb, B] vs flat), or broadcastable (e.g. [B])
        return x.reshape(lead) if x.numel() == n else torch.broadcast_to(x, lead)

    try:
        static = (rows(w.to(cd)) * rows(m.to(cd))).reshape(n)
    except RuntimeError as e:
        raise ValueError(f"row_weights/valid_mask must broadcast to the rows {tuple(lead)}: {e}") from None
    if (static < 0).any():
        raise ValueError("row weights must be >= 0")
    if position_weighting == "dpace":
        if block_size is None:
            if len(lead) < 2:
                raise ValueError("position_weighting='dpace' needs block_size or draft_logits shaped [Nb, B, Vd]")
            block_size = lead[-1]
        if n % block_size:
            raise ValueError(f"{n} rows do not split into blocks of {block_size}")
    teacher = teacher_logprobs.reshape(-1, vd)
    rows_index = None if teacher_rows is None else teacher_rows.reshape(n).to(device=dev)
    return draft_logits.reshape(n, vd), teacher, rows_index, static, lead, block_size


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------------------------------------------------
# chunked custom-Function loss


class _ChunkedCompoundLoss(torch.autograd.Function):
    """Forward: per-chunk values + analytic gradients into one buffer. Backward: buffer × grad_output."""

    @staticmethod
    def forward(ctx, logits, teacher, teacher_rows, static_w, spec_items, options, dpace_block, need_grad, retain):
        chunk_size, smoothing, lk_eta, nla_alpha_min = options
        n, vd = logits.shape
        cd = _compute_dtype(logits)
        weights = dict(spec_items)
        static_w = static_w.to(cd)
        # Gradient rows are scaled by W_r/Σ W inside the loop for static weights; with D-PACE by the static weight
        # inside the loop and by the D-PACE weight/Σ W after it, once α is known.
        if dpace_block is None:
            denom = static_w.sum()
            grad_w = static_w * torch.where(denom > 0, 1.0 / denom, torch.zeros_like(denom))
        else:
            grad_w = static_w
        buf = torch.empty_like(logits, memory_format=torch.contiguous_format) if need_grad else None
        values = torch.zeros(len(LOSS_NAMES), n, dtype=cd, device=logits.device)
        alpha = torch.empty(n, dtype=cd, device=logits.device)
        d_arg = torch.empty(n, dtype=torch.long, device=logits.device)
        t_arg = torch.empty(n, dtype=torch.long, device=logits.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            # the log-softmax is handed over without a name here, so chunk_terms can consume and free it
            vals, alpha[s:e], d_arg[s:e], t_arg[s:e], g = chunk_terms(
                torch.log_softmax(logits[s:e].to(cd), dim=-1),
                (teacher[s:e] if teacher_rows is None else teacher.index_select(0, teacher_rows[s:e])).to(cd),
                weights,
                lk_eta,
                nla_alpha_min,
                need_grad,
            )
            values[:, s:e] = vals
            if need_grad:
                rw = grad_w[s:e]
                g.mul_(rw[:, None])
                outside = (rw == 0).nonzero().squeeze(-1)
                if outside.numel():  # zero (not NaN) for rows outside the loss; a row fill, not a per-element mask
                    g.index_fill_(0, outside, 0.0)
                buf[s:e] = g
                del g
        eff_w = static_w
        if dpace_block is not None:
            trained = (static_w > 0).view(-1, dpace_block)
            dw = dpace_weights(alpha.view(-1, dpace_block), trained, smoothing=smoothing).reshape(n)
            eff_w = static_w * dw
        denom = eff_w.sum()
        inv = torch.where(denom > 0, 1.0 / denom, torch.zeros_like(denom))
        row_loss = sum(w * values[LOSS_NAMES.index(k)] for k, w in weights.items() if w)
        valid = eff_w > 0
        loss = (torch.where(valid, row_loss, 0.0) * eff_w).sum() * inv
        comps = (torch.where(valid, values, 0.0) * eff_w).sum(-1) * inv
        if need_grad and dpace_block is not None:
            buf.mul_((dw * inv)[:, None])
        ctx.buf = buf
        ctx.retain = retain
        ctx.mark_non_differentiable(comps, alpha, d_arg, t_arg, eff_w)
        return loss, comps, alpha, d_arg, t_arg, eff_w

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *_):
        buf = ctx.buf
        if buf is None:
            raise RuntimeError(
                "compound_loss: the gradient buffer was already consumed by a previous backward (or the forward ran "
                "without grad). Pass retain_grad_buffer=True to back-propagate more than once."
            )
        if ctx.retain:
            grad = buf * grad_loss
        else:
            ctx.buf = None
            grad = buf.mul_(grad_loss)
        return grad, None, None, None, None, None, None, None, None


def compound_loss(
    draft_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    row_weights: torch.Tensor | None,
    valid_mask: torch.Tensor | None,
    spec: dict[str, float],
    chunk_size: int | None = None,
    *,
    position_weighting: str = "exp",
    block_size: int | None = None,
    dpace_smoothing: float = 0.5,
    lk_eta: float = DEFAULT_LK_ETA,
    nla_alpha_min: float = DEFAULT_NLA_ALPHA_MIN,
    retain_grad_buffer: bool = False,
    teacher_rows: torch.Tensor | None = None,
) -> LossOutput:
    """Weighted masked-mean compound loss, chunked over rows with an analytic-gradient custom Function.

    Args:
        draft_logits: ``[..., Vd]`` draft logits (any float dtype).
        teacher_logprobs: ``[..., Vd]`` target log-probabilities at the draft vocabulary (no gradient).
        row_weights: per-row weights, one per row in any layout (``[N]`` or ``[Nb, B]``) or broadcastable to the
            rows (e.g. ``position_weights(B)`` for ``[Nb, B, Vd]`` logits), or None for ones. With
            ``position_weighting="dpace"`` they multiply the D-PACE weights: pass the 0/1 trained-slot mask
            (``position_weights(B, position_weighting="dpace", ...)``).
        valid_mask: per-row validity (bool or 0/1), one per row or broadcastable, or None for all valid.
        spec: loss weights over ``LOSS_NAMES``, e.g. ``{"ce": 0.1, "tv": 0.9}`` or ``{"lk_hybrid": 1.0}``.
        chunk_size: rows per chunk; None picks one that keeps the fp32 temporaries small relative to the logits
            (≤ 2^23 elements per temporary and ≤ 1/32 of the logits, at least 2^20 elements).
        position_weighting: ``"exp"`` or ``"uniform"`` (static: row_weights as given) or ``"dpace"`` (times D-PACE
            weights from the detached α; needs ``block_size`` unless the logits are ``[Nb, B, Vd]``).
        lk_eta: η of the ``lk_hybrid`` weight λ = exp(−η·sg[α]) (>= 0; 3 as in the LK paper).
        nla_alpha_min: ε of ``nla`` = −log max(α, ε), in (0, 1).
        retain_grad_buffer: keep the gradient buffer so backward can run more than once.
        teacher_rows: with it, ``teacher_logprobs`` is a table of distinct rows [U, Vd] and draft row r reads row
            ``teacher_rows[r]`` of it (one index per draft row, any layout): what neighbouring blocks share is
            stored once and gathered chunk by chunk, never expanded to the logits' size.
    """
    spec = validate_spec(spec)
    lk_eta, nla_alpha_min = validate_loss_options(lk_eta, nla_alpha_min)
    logits2d, teacher2d, rows_index, static, lead, bsz = _flatten_inputs(
        draft_logits, teacher_logprobs, row_weights, valid_mask, block_size, position_weighting, teacher_rows
    )
    n, vd = logits2d.shape
    if chunk_size is None:
        elems = min(1 << 23, max(1 << 20, (n * vd) // 32))
        chunk_size = max(1, elems // max(vd, 1))
    if int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size!r}")
    need_grad = torch.is_grad_enabled() and draft_logits.requires_grad
    loss, comps, alpha, d_arg, t_arg, eff_w = _ChunkedCompoundLoss.apply(
        logits2d,
        teacher2d.detach(),
        rows_index,
        static,
        tuple(spec.items()),
        (int(chunk_size), float(dpace_smoothing), lk_eta, nla_alpha_min),
        bsz if position_weighting == "dpace" else None,
        need_grad,
        bool(retain_grad_buffer),
    )
    alpha_out = alpha if alpha.dtype == torch.float64 else alpha.float()
    return LossOutput(
        loss=loss,
        components={name: comps[LOSS_NAMES.index(name)].float() for name in spec},
        alpha=alpha_out.view(lead),
        greedy_match=(d_arg == t_arg).view(lead),
        draft_argmax=d_arg.view(lead),
        teacher_argmax=t_arg.view(lead),
        weights=eff_w.float().view(lead),
    )


def compound_loss_reference(
    draft_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    row_weights: torch.Tensor | None,
    valid_mask: torch.Tensor | None,
    spec: dict[str, float],
    chunk_size: int | None = None,  # accepted for signature compatibility; unused
    *,
    position_weighting: str = "exp",
    block_size: int | None = None,
    dpace_smoothing: float = 0.5,
    lk_eta: float = DEFAULT_LK_ETA,
    nla_alpha_min: float = DEFAULT_NLA_ALPHA_MIN,
    retain_grad_buffer: bool = False,  # unused
    teacher_rows: torch.Tensor | None = None,
) -> LossOutput:
    """Plain unchunked autograd implementation of :func:`compound_loss` (tests and benchmarks only)."""
    del chunk_size, retain_grad_buffer
    spec = validate_spec(spec)
    lk_eta, nla_alpha_min = validate_loss_options(lk_eta, nla_alpha_min)
    z, lp, rows_index, static, lead, bsz = _flatten_inputs(
        draft_logits, teacher_logprobs, row_weights, valid_mask, block_size, position_weighting, teacher_rows
    )
    if rows_index is not None:
        lp = lp[rows_index]
    cd = _compute_dtype(z)
    logq = torch.log_softmax(z.to(cd), dim=-1)
    per, alpha, t = reference_terms(logq, lp.detach().to(cd), lk_eta, nla_alpha_min)
    w = static.to(cd)
    if position_weighting == "dpace":
        w = w * dpace_weights(alpha.view(-1, bsz), (w > 0).view(-1, bsz), smoothing=dpace_smoothing).reshape(-1)
    denom = w.sum()
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    valid = w > 0

    def masked_mean(x):
        return (torch.where(valid, x, torch.zeros_like(x)) * w).sum() / denom

    loss = masked_mean(sum(spec[k] * per[k] for k in spec))
    d_arg = logq.argmax(-1)
    return LossOutput(
        loss=loss if cd == torch.float64 else loss.float(),
        components={k: masked_mean(per[k]).detach().float() for k in spec},
        alpha=(alpha if cd == torch.float64 else alpha.float()).view(lead),
        greedy_match=(d_arg == t).view(lead),
        draft_argmax=d_arg.view(lead),
        teacher_argmax=t.view(lead),
        weights=w.detach().float().view(lead),
    )


# ----------------------------------------------------------------------------------------------------------------------
# confidence head


def confidence_loss(
    conf_logits: torch.Tensor,
    alpha: torch.Tensor,
    row_weights: torch.Tensor | None = None,
    valid_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """BCE-with-logits of the confidence head against the detached acceptance α, weighted masked mean (fp32).

    ``row_weights`` / ``valid_mask`` broadcast to ``conf_logits``' shape (e.g. ``LossOutput.weights`` to reuse the
    main loss's effective weights, D-PACE included). Returns 0 (connected to ``conf_logits``) when no row counts.
    """
    x = conf_logits.float()
    target = alpha.detach().float().clamp(0.0, 1.0).broadcast_to(x.shape)
    w = torch.ones_like(x) if row_weights is None else row_weights.detach().float().broadcast_to(x.shape)
    if valid_mask is not None:
        w = w * valid_mask.detach().float().broadcast_to(x.shape)
    bce = F.binary_cross_entropy_with_logits(x, target, reduction="none")
    denom = w.sum()
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    return (torch.where(w > 0, bce, torch.zeros_like(bce)) * w).sum() / denom
