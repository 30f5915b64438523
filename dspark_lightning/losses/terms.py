"""The drafter loss terms: per-row values and analytic logit gradients of one row chunk, and the autograd reference.

Definitions and minima under a sub-normalised teacher: docs/design/losses.md §2, §2.1; the gradients: §4, §4.1."""

from __future__ import annotations

import math

import torch

from dspark_lightning.errors import OptionError

LOSS_NAMES = ("kl", "tv", "ce", "rkl", "js", "nla", "lk_hybrid")
DEFAULT_LK_ETA = 3.0
DEFAULT_NLA_ALPHA_MIN = 1e-6
LOG2 = math.log(2.0)

__all__ = [
    "DEFAULT_LK_ETA",
    "DEFAULT_NLA_ALPHA_MIN",
    "LOSS_NAMES",
    "chunk_terms",
    "reference_terms",
    "validate_loss_options",
    "validate_spec",
]


def validate_spec(spec: dict[str, float]) -> dict[str, float]:
    """Check a loss spec and return it as ``{name: float}`` in canonical order."""
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"loss spec must be a non-empty dict like {{'ce': 0.1, 'tv': 0.9}}; got {spec!r}")
    out: dict[str, float] = {}
    for name, weight in spec.items():
        if name not in LOSS_NAMES:
            raise OptionError(f"unknown loss {name!r} in spec (model.loss.weights); allowed: {', '.join(LOSS_NAMES)}")
        try:
            w = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"loss weight for {name!r} must be a number; got {weight!r}") from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"loss weight for {name!r} must be finite and >= 0; got {weight!r}")
        out[name] = w
    if not any(w > 0 for w in out.values()):
        raise ValueError(f"loss spec needs at least one positive weight; got {spec!r}")
    return {name: out[name] for name in LOSS_NAMES if name in out}


def validate_loss_options(lk_eta: float, nla_alpha_min: float) -> tuple[float, float]:
    """Check the hyperparameters of ``lk_hybrid`` (η) and ``nla`` (the α clamp ε); returns them as floats."""
    eta, eps = float(lk_eta), float(nla_alpha_min)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"lk_eta (the LK hybrid's η in λ = exp(−η·α)) must be finite and >= 0; got {lk_eta!r}")
    if not 0 < eps < 1:
        raise ValueError(f"nla_alpha_min (the α clamp ε of −log α) must be in (0, 1); got {nla_alpha_min!r}")
    return eta, eps


def _masked_dot(mass: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Row sums of mass·x with x zeroed *in place* where mass = 0 (0·log 0 = 0, no NaN from 0·(±inf)).

    A batched matmul, so no further [rows, Vd] temporary is made; ``x`` must be a temporary the caller owns.
    """
    x.masked_fill_(mass == 0, 0.0)
    return torch.bmm(mass.unsqueeze(1), x.unsqueeze(2)).view(-1)


def chunk_terms(
    logq: torch.Tensor,
    lp: torch.Tensor,
    weights: dict[str, float],
    lk_eta: float,
    nla_alpha_min: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Values ``[len(LOSS_NAMES), rows]`` (0 for terms not in ``weights`` but tv, ce), α, argmax q, t, gradient.

    ``logq``: draft log-softmax of the chunk, ``lp``: teacher log-probs, both in the compute dtype. The returned
    gradient is that of Σ_c weights[c]·L_c per row (unscaled by row weights); ``logq`` is consumed (reused in place).
    """
    rows = logq.shape[0]
    d_arg = logq.max(-1).indices  # = argmax (the first maximal index), in one vectorised pass on CPU
    w = {k: weights.get(k, 0.0) for k in LOSS_NAMES}
    values = torch.zeros(len(LOSS_NAMES), rows, dtype=logq.dtype, device=logq.device)
    t = lp.max(-1).indices
    p = lp.exp()
    q = logq.exp()
    alpha = torch.minimum(p, q).sum(-1)
    values[1] = 1.0 - alpha
    values[2] = -logq.gather(-1, t[:, None]).squeeze(-1)
    if "kl" in weights or "lk_hybrid" in weights:
        # Σ p log p as p · lp with −inf clamped to the lowest float (0 · −inf would be NaN; p = 0 there anyway):
        # the same terms as xlogy(p, p), without a log per element
        finite_lp = lp.clamp(min=torch.finfo(lp.dtype).min)
        values[0] = torch.linalg.vecdot(p, finite_lp) - torch.linalg.vecdot(p, logq)
        del finite_lp
    lam = torch.exp(-lk_eta * alpha) if "lk_hybrid" in weights else None  # α carries no gradient here: sg[α]
    if lam is not None:
        values[6] = lam * values[0] + (1.0 - lam) * values[1]
    if "nla" in weights:
        values[5] = -torch.log(alpha.clamp_min(nla_alpha_min))  # the published form: α clamped inside the log
    # element terms h of rkl/js, combined into one temporary: H = w_rkl·(log q − log p) + w_js·½(log q − log m)
    H = None
    if "rkl" in weights:
        r = logq - lp
        values[3] = _masked_dot(q, r)  # r is 0 where q = 0 from here on, which q ⊙ H ignores anyway
        H = r.mul_(w["rkl"]) if need_grad and w["rkl"] else None
        del r
    if "js" in weights:
        log_m = torch.logaddexp(lp, logq).sub_(LOG2)
        x_q = logq.sub_(log_m)  # log q − log m ≤ log 2, in logq's storage (logq is not read after this)
        js_q = 0.5 * _masked_dot(q, x_q)  # ½ Σ q log(q/m)
        values[4] = js_q + 0.5 * _masked_dot(p, log_m.neg_().add_(lp))  # log_m's storage now holds log p − log m
        del log_m
        if need_grad and w["js"]:
            hj = x_q.mul_(0.5 * w["js"])
            H = hj if H is None else H.add_(hj)
            del hj
        del x_q
    del logq
    if not need_grad:
        return values, alpha, d_arg, t, None
    c_kl = torch.full((rows,), w["kl"], dtype=q.dtype, device=q.device)
    c_tv = torch.full((rows,), w["tv"], dtype=q.dtype, device=q.device)
    if lam is not None and w["lk_hybrid"]:
        c_kl += w["lk_hybrid"] * lam
        c_tv += w["lk_hybrid"] * (1.0 - lam)
    if w["nla"]:
        # d(−log max(α, ε))/dα = −1/α where α ≥ ε (clamp_min passes the gradient at equality), else 0
        c_tv += w["nla"] * torch.where(alpha >= nla_alpha_min, 1.0 / alpha.clamp_min(nla_alpha_min), 0.0)
    a = torch.full((rows,), w["ce"], dtype=q.dtype, device=q.device)
    qm = None
    use_kl = bool(w["kl"] or w["lk_hybrid"])  # decided from the spec, not the data: no device sync per chunk
    use_tv = bool(w["tv"] or w["nla"] or w["lk_hybrid"])
    if use_kl:
        a += c_kl * p.sum(-1)
    if use_tv:
        # q·m with m = 1 where q < p, ½ where q = p, 0 where q > p, as (sign(p − q) + 1)·q/2: exact, in arithmetic
        # passes (a comparison into a boolean tensor and its conversion cost several times more per element on CPU)
        qm = torch.sub(p, q).sign_().add_(1.0).mul_(q).mul_(0.5)
        a += c_tv * qm.sum(-1)
    if w["rkl"]:
        a -= w["rkl"] * values[3]
    if w["js"]:
        a -= w["js"] * js_q
    g = q.mul_(a[:, None] if H is None else H.add_(a[:, None]))
    del H
    if use_kl:
        g.sub_(p.mul_(c_kl[:, None]))
    del p
    if qm is not None:
        g.sub_(qm.mul_(c_tv[:, None]))
        del qm
    if w["ce"]:
        g.scatter_add_(-1, t[:, None], torch.full((rows, 1), -w["ce"], dtype=g.dtype, device=g.device))
    return values, alpha, d_arg, t, g


def reference_terms(
    logq: torch.Tensor, lp: torch.Tensor, lk_eta: float, nla_alpha_min: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Per-row values of every term as plain differentiable torch expressions (autograd reference); α, t."""
    q, p = logq.exp(), lp.exp()
    t = lp.argmax(-1)
    alpha = torch.minimum(p, q).sum(-1)
    kl = torch.where(p > 0, p * (lp - logq), torch.zeros_like(p)).sum(-1)
    tv = 1.0 - alpha
    log_m = torch.logaddexp(lp, logq) - LOG2
    lam = torch.exp(-lk_eta * alpha.detach())  # λ = exp(−η·sg[α]), stop-gradient as published
    per = {
        "kl": kl,
        "tv": tv,
        "ce": -logq.gather(-1, t[:, None]).squeeze(-1),
        "rkl": torch.where(q > 0, q * (logq - lp), torch.zeros_like(q)).sum(-1),
        "js": 0.5 * torch.where(p > 0, p * (lp - log_m), torch.zeros_like(p)).sum(-1)
        + 0.5 * torch.where(q > 0, q * (logq - log_m), torch.zeros_like(q)).sum(-1),
        "nla": -torch.log(alpha.clamp_min(nla_alpha_min)),
        "lk_hybrid": lam * kl + (1.0 - lam) * tv,
    }
    return per, alpha.detach(), t
