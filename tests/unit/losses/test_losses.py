"""Losses: independent references (brute-force loops, scipy, hand formulas) and chunked == unchunked autograd."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.special import rel_entr

from dspark_lightning.losses import (
    LOSS_NAMES,
    compound_loss,
    compound_loss_reference,
    confidence_loss,
    position_weights,
    row_weights_for_blocks,
    validate_spec,
)
from dspark_lightning.metrics import AcceptanceMetrics

ALL = {"kl": 0.3, "tv": 0.5, "ce": 0.2}


def make_case(nb=3, b=4, vd=11, v=None, dtype=torch.float64, seed=0, scale=2.0):
    """Draft logits [nb, b, vd] and teacher log-probs gathered from a full vocab v ≥ vd (sub-normalised if v > vd)."""
    g = torch.Generator().manual_seed(seed)
    v = vd if v is None else v
    z = (torch.randn(nb, b, vd, generator=g, dtype=torch.float64) * scale).to(dtype)
    full = torch.log_softmax(torch.randn(nb, b, v, generator=g, dtype=torch.float64) * scale, -1)
    ids = torch.randperm(v, generator=g)[:vd]
    return z, full[..., ids]


def brute_alpha(z, lp):
    """Σ_v min(p_v, q_v) with Python loops in float64."""
    out = []
    for zr, lr in zip(z.double().reshape(-1, z.shape[-1]).tolist(), lp.double().reshape(-1, lp.shape[-1]).tolist()):
        mx = max(zr)
        ez = [math.exp(x - mx) for x in zr]
        s = sum(ez)
        out.append(sum(min(math.exp(lv), e / s) for lv, e in zip(lr, ez)))
    return torch.tensor(out, dtype=torch.float64).view(z.shape[:-1])


# ---------------------------------------------------------------------------------------------------------- specs


def test_spec_validation():
    assert validate_spec({"tv": 0.9, "ce": 0.1}) == {"tv": 0.9, "ce": 0.1}
    with pytest.raises(ValueError, match=r"'mse'.*kl, tv, ce"):
        validate_spec({"mse": 1.0})
    with pytest.raises(ValueError, match="'kl'"):
        validate_spec({"kl": -0.1})
    for bad in ({}, {"kl": 0.0}, {"tv": float("nan")}, ["kl"]):
        with pytest.raises(ValueError):
            validate_spec(bad)
    z, lp = make_case()
    with pytest.raises(ValueError, match="unknown loss"):
        compound_loss(z, lp, None, None, {"kld": 1.0})


# ---------------------------------------------------------------------------------------------------------- values


def test_perfect_draft():
    z, _ = make_case(nb=4, b=8, vd=50)
    lp = torch.log_softmax(z, -1)
    out = compound_loss(z.float(), lp.float(), None, None, ALL)
    assert out.components["tv"].abs().item() < 1e-5
    assert out.components["kl"].abs().item() < 1e-5
    # CE is −log p(argmax p), computed directly
    p = lp.exp()
    direct = -p.max(-1).values.log().mean()
    assert out.components["ce"].item() == pytest.approx(direct.item(), rel=1e-5)
    assert out.alpha.min().item() > 0.99
    assert out.greedy_match.all()
    ones = torch.ones(4, 8, dtype=torch.bool)
    acc = AcceptanceMetrics(8)
    acc.update(out.alpha, out.greedy_match, ones)
    res = acc.compute()
    assert res["accept_rate"].item() > 0.99 and res["greedy_tau"].item() == 9.0
    assert res["tau"].item() == pytest.approx(9.0, abs=1e-4)  # B + 1
    dflash = AcceptanceMetrics(7)  # anchor slot untrained: the metrics see slots 1..B−1 and tau = B
    dflash.update(out.alpha[:, 1:], out.greedy_match[:, 1:], ones[:, 1:])
    assert dflash.compute()["tau"].item() == pytest.approx(8.0, abs=1e-4)
    assert torch.equal(out.draft_argmax, out.teacher_argmax)
    # TV and KL are stationary at the perfect draft: their gradient vanishes
    zz = z.clone().requires_grad_()
    compound_loss(zz, lp, None, None, {"tv": 0.5, "kl": 0.5}).loss.backward()
    assert zz.grad.abs().max().item() < 1e-12


@pytest.mark.parametrize("v", [9, 15])  # Vd = V (normalised) and Vd < V (sub-normalised teacher)
def test_values_against_independent_formulas(v):
    z, lp = make_case(nb=2, b=3, vd=9, v=v)
    out = compound_loss(z, lp, None, None, ALL, chunk_size=4)
    alpha = brute_alpha(z, lp)
    assert torch.allclose(out.alpha, alpha, atol=1e-12)
    p = lp.exp().reshape(-1, 9).numpy()
    q = torch.softmax(z, -1).reshape(-1, 9).numpy()
    kl = rel_entr(p, q).sum(-1)
    ce = -torch.log_softmax(z, -1).reshape(-1, 9)[torch.arange(6), lp.reshape(-1, 9).argmax(-1)]
    assert out.components["kl"].item() == pytest.approx(kl.mean(), rel=1e-6)
    assert out.components["ce"].item() == pytest.approx(ce.mean().item(), rel=1e-6)
    assert out.components["tv"].item() == pytest.approx(1 - alpha.mean().item(), rel=1e-6)
    if v == 9:  # both normalised: 1 − Σ min = ½ Σ |p − q|
        assert out.components["tv"].item() == pytest.approx(0.5 * abs(p - q).sum(-1).mean(), rel=1e-6)
    assert out.loss.item() == pytest.approx(sum(ALL[k] * out.components[k].item() for k in ALL), rel=1e-6)


def test_weighted_masked_mean_by_hand():
    z, lp = make_case(nb=2, b=3, vd=7, v=10)
    w = torch.tensor([1.0, 0.5, 0.25])
    m = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    out = compound_loss(z, lp, w, m, {"tv": 1.0})
    tv = 1 - brute_alpha(z, lp)
    ww = w.double().expand(2, 3) * m
    assert out.loss.item() == pytest.approx(((ww * tv).sum() / ww.sum()).item(), rel=1e-10)
    assert torch.equal(out.weights, ww.float())
    flat = compound_loss(z.view(6, 7), lp.view(6, 7), w.repeat(2), m, {"tv": 1.0})  # [Nb, B] mask, flat rows
    torch.testing.assert_close(flat.loss, out.loss)
    assert out.alpha.shape == (2, 3) and out.greedy_match.dtype == torch.bool


# ---------------------------------------------------------------------------------------------------------- chunked == reference


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk", [1, 5, 12, 100])
@pytest.mark.parametrize("weighting", ["exp", "dpace"])
def test_chunked_equals_reference(dtype, chunk, weighting):
    z, lp = make_case(nb=3, b=4, vd=37, v=53, dtype=dtype, seed=chunk)
    w = position_weights(4, position_weighting=weighting, sample_from_anchor=False)
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    a = compound_loss(z1, lp, w, m, ALL, chunk, position_weighting=weighting)
    r = compound_loss_reference(z2, lp, w, m, ALL, position_weighting=weighting)
    a.loss.backward()
    r.loss.backward()
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(a.loss, r.loss, **tol)
    torch.testing.assert_close(z1.grad, z2.grad, **tol)
    assert z1.grad[2].abs().max() == 0  # fully masked block: no gradient
    for k in ALL:
        torch.testing.assert_close(a.components[k], r.components[k], **tol)
    for f in ("alpha", "weights"):
        torch.testing.assert_close(getattr(a, f), getattr(r, f), **tol)
    for f in ("greedy_match", "draft_argmax", "teacher_argmax"):
        assert torch.equal(getattr(a, f), getattr(r, f))


@pytest.mark.parametrize("spec", [{"kl": 1.0}, {"tv": 1.0}, {"ce": 1.0}, {"ce": 0.1, "tv": 0.9}])
def test_single_components_flat_rows(spec):
    z, lp = make_case(nb=2, b=5, vd=23, v=31, seed=3)
    z, lp = z.view(10, 23), lp.view(10, 23)
    rw = row_weights_for_blocks(2, 5, gamma=3.0)
    m = torch.rand(10, generator=torch.Generator().manual_seed(0)) > 0.3
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    for weighting in ("exp", "dpace"):
        z1.grad = z2.grad = None
        a = compound_loss(z1, lp, rw, m, spec, 3, position_weighting=weighting, block_size=5)
        r = compound_loss_reference(z2, lp, rw, m, spec, position_weighting=weighting, block_size=5)
        (3.0 * a.loss).backward()  # grad_output != 1
        (3.0 * r.loss).backward()
        torch.testing.assert_close(a.loss, r.loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-10, atol=1e-12)
        assert list(a.components) == [k for k in LOSS_NAMES if k in spec]


def test_bf16_logits_within_tolerance():
    z, lp = make_case(nb=4, b=4, vd=301, v=400, dtype=torch.float32, seed=5)
    zb = z.bfloat16()
    z1, z2 = zb.clone().requires_grad_(), z.clone().requires_grad_()
    a = compound_loss(z1, lp.bfloat16(), None, None, ALL, chunk_size=6)
    r = compound_loss_reference(z2, lp, None, None, ALL)
    a.loss.backward()
    r.loss.backward()
    assert a.loss.dtype == torch.float32 and z1.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.loss, r.loss, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(z1.grad.float(), z2.grad, rtol=5e-2, atol=2e-4)
    # against the reference run on the same bf16 inputs the agreement is much tighter
    z3 = zb.clone().requires_grad_()
    r3 = compound_loss_reference(z3, lp.bfloat16(), None, None, ALL)
    r3.loss.backward()
    torch.testing.assert_close(a.loss, r3.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z1.grad.float(), z3.grad.float(), rtol=1e-2, atol=1e-5)


def test_gradcheck():
    z, lp = make_case(nb=2, b=3, vd=5, v=7, seed=7)
    w = torch.tensor([1.0, 0.6, 0.3], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.bool)

    def f(x):
        return compound_loss(x, lp, w, m, ALL, 4, retain_grad_buffer=True).loss

    assert torch.autograd.gradcheck(f, (z.clone().requires_grad_(),))


# ---------------------------------------------------------------------------------------------------------- edges


def test_fully_masked_loss_is_zero_and_backward_works():
    z, lp = make_case()
    zz = z.clone().requires_grad_()
    out = compound_loss(zz, lp, None, torch.zeros(3, 4, dtype=torch.bool), ALL)
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    out.loss.backward()
    assert torch.equal(zz.grad, torch.zeros_like(z))


def test_backward_once_unless_retained_and_no_grad_path():
    z, lp = make_case()
    zz = z.clone().requires_grad_()
    out = compound_loss(zz, lp, None, None, ALL)
    out.loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_grad_buffer"):
        out.loss.backward()
    z2 = z.clone().requires_grad_()
    out2 = compound_loss(z2, lp, None, None, ALL, retain_grad_buffer=True)
    out2.loss.backward(retain_graph=True)
    out2.loss.backward()
    torch.testing.assert_close(z2.grad, 2 * zz.grad)
    with torch.no_grad():
        ng = compound_loss(zz, lp, None, None, ALL)
    assert not ng.loss.requires_grad
    torch.testing.assert_close(ng.loss, out.loss.detach())


def test_shape_errors():
    z, lp = make_case()
    with pytest.raises(ValueError):
        compound_loss(z, lp[..., :5], None, None, ALL)
    with pytest.raises(ValueError):
        compound_loss(z, lp, torch.ones(5), None, ALL)
    with pytest.raises(ValueError):
        compound_loss(z.view(12, -1), lp.view(12, -1), None, None, ALL, position_weighting="dpace")
    with pytest.raises(ValueError):
        compound_loss(z.view(12, -1), lp.view(12, -1), None, None, ALL, position_weighting="dpace", block_size=5)
    with pytest.raises(ValueError):
        compound_loss(z, lp, -torch.ones(4), None, ALL)


# ---------------------------------------------------------------------------------------------------------- confidence


def test_confidence_loss_by_hand():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    alpha = torch.rand(3, 4, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 0.5, 0.5, 0.25], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    got = confidence_loss(x, alpha, w, m)
    total, den = 0.0, 0.0
    for i in range(3):
        for k in range(4):
            if m[i, k]:
                s = 1 / (1 + math.exp(-x[i, k].item()))
                a = alpha[i, k].item()
                total += w[k].item() * -(a * math.log(s) + (1 - a) * math.log(1 - s))
                den += w[k].item()
    assert got.item() == pytest.approx(total / den, rel=1e-6)
    got.backward()
    assert x.grad[2].abs().max() == 0
    z = torch.zeros(2, requires_grad=True)
    zero = confidence_loss(z, torch.ones(2), None, torch.zeros(2, dtype=torch.bool))
    zero.backward()
    assert zero.item() == 0.0 and torch.equal(z.grad, torch.zeros(2))


# ---------------------------------------------------------------------------------------------------------- rkl, js, nla, lk_hybrid
NEW = ("rkl", "js", "nla", "lk_hybrid")
FAMILY = {"kl": 0.1, "tv": 0.2, "ce": 0.1, "rkl": 0.2, "js": 0.3, "nla": 0.2, "lk_hybrid": 0.4}


def independent_rows(z, lp, eta=3.0, eps=1e-6):
    """Per-row values of the new terms, float64 autograd, written from the definitions (xlogy, explicit m = (p+q)/2,
    min as a where) — not from the library's formulas."""
    z, lp = z.double(), lp.double()
    q, p = torch.softmax(z, -1), lp.exp()
    alpha = torch.where(q < p, q, p).sum(-1)
    kl = (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(-1)
    m = 0.5 * (p + q)
    lam = torch.exp(-eta * alpha.detach())
    return {
        "kl": kl,
        "tv": 1 - alpha,
        "ce": -torch.log(q.gather(-1, p.argmax(-1, keepdim=True)).squeeze(-1)),
        "rkl": (torch.special.xlogy(q, q) - q * lp).sum(-1),
        "js": 0.5 * (torch.special.xlogy(p, p / m) + torch.special.xlogy(q, q / m)).sum(-1),
        "nla": -torch.log(torch.clamp(alpha, min=eps)),
        "lk_hybrid": lam * kl + (1 - lam) * (1 - alpha),
    }


def independent_loss(z, lp, spec, w, **kw):
    rows = independent_rows(z, lp, **kw)
    total = sum(c * rows[k] for k, c in spec.items())
    return (total * w).sum() / w.sum()


@pytest.mark.parametrize("spec", [{k: 1.0} for k in NEW] + [{"lk_hybrid": 1.0, "ce": 0.1}, FAMILY])
@pytest.mark.parametrize("v", [13, 21])  # normalised teacher, sub-normalised teacher (Vd = 13 < V = 21)
def test_new_terms_against_independent_autograd(spec, v):
    z, lp = make_case(nb=3, b=4, vd=13, v=v, seed=11)
    w = position_weights(4, gamma=2.0, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    out = compound_loss(z1, lp, w, m, spec, chunk_size=5)
    (2.0 * out.loss).backward()
    ref = independent_loss(z2, lp, spec, w.expand(3, 4) * m)
    (2.0 * ref).backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-12)
    assert z1.grad[1, 1].abs().max() == 0  # masked row
    rows = independent_rows(z, lp)
    ww = w.expand(3, 4) * m
    for k in spec:  # every reported component is its own weighted mean
        assert out.components[k].item() == pytest.approx(((rows[k] * ww).sum() / ww.sum()).item(), rel=1e-6)
    r = compound_loss_reference(z, lp, w, m, spec)  # the library's autograd reference agrees too
    torch.testing.assert_close(r.loss, out.loss, rtol=1e-10, atol=1e-12)


def brute_dpace(alpha, trained, lam):
    """D-PACE weights (docs/design/losses.md §7) by brute-force loops over plain floats: d_k = Σ_{m ≥ k, m trained}
    Π_{j ≤ m} a_j with a_j = (1 − λ)·α_j + λ (1 for untrained slots), 0 on untrained slots, then scaled to mean 1
    over the trained slots of the batch. Returns a float64 tensor, a constant (no graph)."""
    nb, b = len(alpha), len(alpha[0])
    d = [[0.0] * b for _ in range(nb)]
    for i in range(nb):
        for k in range(b):
            if trained[i][k]:
                for m in range(k, b):
                    if trained[i][m]:
                        prod = 1.0
                        for j in range(m + 1):
                            prod *= (1 - lam) * alpha[i][j] + lam if trained[i][j] else 1.0
                        d[i][k] += prod
    n = sum(t for row in trained for t in row)
    total = sum(map(sum, d))
    return torch.tensor([[x * n / total for x in row] for row in d], dtype=torch.float64)


@pytest.mark.parametrize("spec", [ALL, {"tv": 1.0}, FAMILY])
@pytest.mark.parametrize("flat", [False, True])
def test_dpace_loss_against_brute_force_weights(spec, flat):
    """loss = Σ W_r L_r / Σ W_r with W_r = static_r·valid_r·d_r, d from brute-force loops over the brute-force α,
    L_r from the definitions (independent_rows) and d detached: value, logits gradient and reported weights."""
    nb, b, vd, lam = 3, 5, 9, 0.3
    z, lp = make_case(nb=nb, b=b, vd=vd, v=14, seed=12)
    static = [0.0, 1.0, 1.0, 1.0, 1.0]  # DFlash form: slot 0 untrained
    valid = [[1, 1, 1, 1, 1], [1, 1, 0, 1, 1], [0, 1, 1, 0, 1]]
    trained = [[static[k] > 0 and valid[i][k] == 1 for k in range(b)] for i in range(nb)]
    d = brute_dpace(brute_alpha(z, lp).tolist(), trained, lam)
    assert d[torch.tensor(trained)].std().item() > 0.1  # the weights differ across slots: the weighting matters
    W = torch.tensor(static, dtype=torch.float64) * torch.tensor(valid, dtype=torch.float64) * d
    # reference: float64 autograd with the weights as constants
    z_ref = z.clone().requires_grad_()
    rows = independent_rows(z_ref, lp)
    ref = (sum(c * rows[k] for k, c in spec.items()) * W).sum() / W.sum()
    (2.0 * ref).backward()

    z_lib = z.clone().requires_grad_()
    m = torch.tensor(valid, dtype=torch.bool)
    w = position_weights(b, position_weighting="dpace", sample_from_anchor=False, dtype=torch.float64)
    if flat:
        out = compound_loss(
            z_lib.view(nb * b, vd), lp.view(nb * b, vd), w.repeat(nb), m.view(-1), spec, 4,
            position_weighting="dpace", block_size=b, dpace_smoothing=lam,
        )  # fmt: skip
    else:
        out = compound_loss(z_lib, lp, w, m, spec, 4, position_weighting="dpace", dpace_smoothing=lam)
    (2.0 * out.loss).backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(z_lib.grad, z_ref.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.weights.double().view(nb, b), W, rtol=1e-6, atol=1e-7)  # reported as float32
    assert z_lib.grad[1, 2].abs().max() == 0 and z_lib.grad[:, 0].abs().max() == 0  # invalid and untrained rows

    # the weights carry no gradient: letting d depend on α through autograd changes the gradient, so the check above
    # would catch a non-detached d
    z_bad = z.clone().requires_grad_()
    rows = independent_rows(z_bad, lp)
    a = (1 - lam) * (1 - rows["tv"]) + lam
    tr = torch.tensor(trained)
    a = torch.where(tr, a, torch.ones_like(a))
    prefix = torch.cumprod(a, -1) * tr
    d_live = prefix.flip(-1).cumsum(-1).flip(-1) * tr
    d_live = d_live * (tr.sum() / d_live.sum())
    torch.testing.assert_close(d_live.detach(), d, rtol=1e-12, atol=1e-14)  # same values as the brute force
    W_live = torch.tensor(static, dtype=torch.float64) * torch.tensor(valid, dtype=torch.float64) * d_live
    (2.0 * (sum(c * rows[k] for k, c in spec.items()) * W_live).sum() / W_live.sum()).backward()
    assert (z_bad.grad - z_lib.grad).abs().max().item() > 1e-4


def test_new_terms_gradcheck():
    z, lp = make_case(nb=2, b=3, vd=6, v=9, seed=4)  # sub-normalised teacher
    w = torch.tensor([1.0, 0.6, 0.3], dtype=torch.float64)
    # lk_hybrid's λ and D-PACE's weights are stop-gradient functions of α, which finite differences cannot respect:
    # the hybrid is checked at η = 0 here, and against autograd with sg[α] above
    spec = {k: v for k, v in FAMILY.items()}

    def f(x):
        return compound_loss(x, lp, w, None, spec, 4, lk_eta=0.0, retain_grad_buffer=True).loss

    assert torch.autograd.gradcheck(f, (z.clone().requires_grad_(),))


def grad_of(z, lp, spec, **kw):
    zz = z.clone().requires_grad_()
    out = compound_loss(zz, lp, None, None, spec, **kw)
    out.loss.backward()
    return out, zz.grad


@pytest.mark.parametrize("name", NEW)
def test_perfect_draft_zero_loss_and_gradient(name):
    z, _ = make_case(nb=2, b=4, vd=30)
    out, g = grad_of(z, torch.log_softmax(z, -1), {name: 1.0})
    assert abs(out.loss.item()) < 1e-12 and g.abs().max().item() < 1e-12


def test_renormalised_teacher_is_stationary_for_sub_normalised_p():
    z, lp = make_case(nb=2, b=3, vd=10, v=25, seed=2)
    s = lp.exp().sum(-1)
    assert (s < 0.9).all()
    zs = lp.clone()  # softmax(lp) = p / S
    for name in ("kl", "tv", *NEW):
        _, g = grad_of(zs, lp, {name: 1.0})
        assert g.abs().max().item() < 1e-12, name
    # minimum values from the definitions: rkl = nla = −log S, tv = 1 − S, js = ½[S log(2S/(1+S)) + log(2/(1+S))]
    out = compound_loss(zs, lp, None, None, {"rkl": 1.0, "nla": 1.0, "tv": 1.0, "js": 1.0})
    js = 0.5 * (s * torch.log(2 * s / (1 + s)) + torch.log(2 / (1 + s)))
    assert out.components["rkl"].item() == pytest.approx(-s.log().mean().item(), rel=1e-6)
    assert out.components["nla"].item() == pytest.approx(-s.log().mean().item(), rel=1e-6)
    assert out.components["tv"].item() == pytest.approx((1 - s).mean().item(), rel=1e-6)
    assert out.components["js"].item() == pytest.approx(js.mean().item(), rel=1e-6)
    assert (js > 0).all()


@pytest.mark.parametrize("floor", [float("-inf"), -40.0])  # exact point mass, and one with a tiny floor
def test_point_mass_teacher_nla_equals_ce(floor):
    z, _ = make_case(nb=3, b=4, vd=17, seed=9)
    t = torch.randint(17, (3, 4), generator=torch.Generator().manual_seed(0))
    lp = torch.full_like(z, floor).scatter(-1, t[..., None], 0.0)
    if floor > float("-inf"):
        lp = torch.log_softmax(lp, -1)
    a, ga = grad_of(z, lp, {"nla": 1.0})
    c, gc = grad_of(z, lp, {"ce": 1.0})
    torch.testing.assert_close(a.loss, c.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ga, gc, rtol=1e-9, atol=1e-12)


def test_nla_gradient_is_tv_gradient_over_alpha_and_clamped_below_eps():
    z, lp = make_case(nb=1, b=1, vd=20, v=30, seed=6)
    nla, g_nla = grad_of(z, lp, {"nla": 1.0})
    _, g_tv = grad_of(z, lp, {"tv": 1.0})
    torch.testing.assert_close(g_nla * nla.alpha.item(), g_tv, rtol=1e-10, atol=1e-14)
    # a row with α < ε: value −log ε, no gradient (the clamp is active)
    eps = nla.alpha.item() * 2
    out, g = grad_of(z, lp, {"nla": 1.0}, nla_alpha_min=eps)
    assert out.loss.item() == pytest.approx(-math.log(eps)) and g.abs().max().item() == 0


def test_lk_hybrid_limits_in_eta():
    z, lp = make_case(nb=2, b=4, vd=15, v=20, seed=8)
    kl, g_kl = grad_of(z, lp, {"kl": 1.0})
    tv, g_tv = grad_of(z, lp, {"tv": 1.0})
    h0, g0 = grad_of(z, lp, {"lk_hybrid": 1.0}, lk_eta=0.0)
    torch.testing.assert_close(h0.loss, kl.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g0, g_kl, rtol=1e-12, atol=1e-14)
    assert tv.alpha.min().item() > 0.05  # exp(−1e4·α) underflows to 0 below
    hinf, ginf = grad_of(z, lp, {"lk_hybrid": 1.0}, lk_eta=1e4)
    torch.testing.assert_close(hinf.loss, tv.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ginf, g_tv, rtol=1e-12, atol=1e-14)
    h3 = compound_loss(z, lp, None, None, {"lk_hybrid": 1.0})  # default η = 3, between the two
    lo, hi = sorted((kl.loss.item(), tv.loss.item()))
    assert lo < h3.loss.item() < hi


def test_js_bounded_with_finite_gradients_at_extremes():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 12, generator=g, dtype=torch.float64)
    z[0, :6] = -800.0  # q_v ≈ 0 on half the vocab (exp underflows to exactly 0)
    lp = torch.log_softmax(torch.randn(4, 12, generator=g, dtype=torch.float64), -1)
    lp[1, 6:] = -800.0  # p_v ≈ 0
    first = torch.arange(12) < 6
    lp[2] = torch.log_softmax(torch.where(first, 0.0, -800.0).double(), -1)  # disjoint supports: js = log 2
    z[2] = torch.where(first, -800.0, 0.0).double()
    lp[3, 6:] = float("-inf")
    out, grad = grad_of(z, lp, {"js": 1.0})
    rows = independent_rows(z, lp)["js"]
    assert torch.isfinite(grad).all() and (rows >= 0).all() and (rows <= math.log(2) + 1e-12).all()
    assert rows[2].item() == pytest.approx(math.log(2), rel=1e-12)
    assert out.loss.item() == pytest.approx(rows.mean().item(), rel=1e-12)


def test_new_terms_bf16_logits():
    z, lp = make_case(nb=4, b=4, vd=301, v=400, dtype=torch.float32, seed=5)
    spec = {"rkl": 0.3, "js": 0.3, "nla": 0.2, "lk_hybrid": 0.2}
    zb = z.bfloat16().requires_grad_()
    a = compound_loss(zb, lp.bfloat16(), None, None, spec, chunk_size=7)
    a.loss.backward()
    assert zb.grad.dtype == torch.bfloat16 and torch.isfinite(zb.grad.float()).all()
    z64 = z.bfloat16().double().requires_grad_()  # the same bf16 inputs, float64 independent reference
    ref = independent_loss(z64, lp.bfloat16().double(), spec, torch.ones(4, 4, dtype=torch.float64))
    ref.backward()
    torch.testing.assert_close(a.loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(zb.grad.double(), z64.grad, rtol=1e-2, atol=1e-5)


def test_bad_options_name_the_option():
    z, lp = make_case()
    with pytest.raises(ValueError, match=r"'jsd'.*rkl, js, nla, lk_hybrid"):
        compound_loss(z, lp, None, None, {"jsd": 1.0})
    with pytest.raises(ValueError, match="'lk_hybrid'.*>= 0"):
        compound_loss(z, lp, None, None, {"lk_hybrid": -1.0})
    for eta in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lk_eta"):
            compound_loss(z, lp, None, None, {"lk_hybrid": 1.0}, lk_eta=eta)
    for eps in (0.0, 1.0, -1e-3):
        with pytest.raises(ValueError, match="nla_alpha_min"):
            compound_loss_reference(z, lp, None, None, {"nla": 1.0}, nla_alpha_min=eps)


@pytest.mark.parametrize("spec", [ALL, {"rkl": 0.5, "js": 0.5}, {"lk_hybrid": 1.0}])
def test_a_teacher_table_read_by_row_equals_the_expanded_teacher(spec):
    # blocks overlap, so many draft rows read one teacher row: the table holds 5 rows for 3 x 4 draft rows
    z, lp = make_case(nb=3, b=4, vd=11)
    table = lp.reshape(-1, 11)[:5]
    rows = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4], [4, 4, 0, 2]])
    expanded = torch.stack([torch.stack([table[r] for r in block]) for block in rows.tolist()])
    weights = torch.exp(-torch.arange(4, dtype=torch.float64) / 4)
    zt, ze = z.clone().requires_grad_(), z.clone().requires_grad_()
    got = compound_loss(zt, table, weights, None, spec, chunk_size=5, teacher_rows=rows)
    want = compound_loss_reference(ze, expanded, weights, None, spec)
    got.loss.backward()
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got.alpha, want.alpha, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(zt.grad, ze.grad, rtol=1e-10, atol=1e-13)
    assert torch.equal(got.teacher_argmax, want.teacher_argmax)
    with pytest.raises(ValueError, match="one row index per draft row"):
        compound_loss(z, table, weights, None, spec, teacher_rows=rows[:2])
