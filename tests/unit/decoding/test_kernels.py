"""Packed verify kernels: the packed linear against a float64 reference, scoping, fallbacks, and lossless decoding."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers.targets import greedy_reference, make_tiny_qwen3
from torch import nn

import dspark_lightning.measuring.cost as cost_module
from dspark_lightning.decoding import speculative_generate
from dspark_lightning.decoding.kernels import PackedLinears, packed_kernels_available
from dspark_lightning.decoding.target_forwards import TargetForwards
from dspark_lightning.measuring import measure_verify_cost
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig

pytestmark = pytest.mark.skipif(not packed_kernels_available(), reason="this torch build has no oneDNN packed linear")


def _layers(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(48, 40), nn.GELU(), nn.Linear(40, 24, bias=False))


def _reference(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    first, _, last = layers
    h = x.double() @ first.weight.double().T + first.bias.double()
    return torch.nn.functional.gelu(h) @ last.weight.double().T


@pytest.mark.parametrize("rows", [1, 2, 5, 9, 17])
@pytest.mark.parametrize("batched", [False, True])
def test_packed_linears_match_a_float64_reference(rows, batched):
    layers = _layers()
    x = torch.randn((1, rows, 48) if batched else (rows, 48), generator=torch.Generator().manual_seed(rows))
    with torch.no_grad(), PackedLinears(layers, batch_hint=9) as packed:
        y = layers(x)
    assert len(packed.linears) == 2
    assert y.shape == (*x.shape[:-1], 24) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _reference(layers, x), atol=1e-5, rtol=1e-5)


def test_the_default_forward_is_back_after_the_block_even_on_an_error():
    layers = _layers()
    x = torch.randn(3, 48)
    with torch.no_grad():
        before = layers(x)
        with pytest.raises(RuntimeError, match="inside"), PackedLinears(layers, batch_hint=4):
            assert all("forward" in m.__dict__ for m in layers if isinstance(m, nn.Linear))
            raise RuntimeError("inside")
        assert not any("forward" in m.__dict__ for m in layers)
        assert torch.equal(layers(x), before)  # the same default kernels: bitwise equal


def test_with_autograd_on_the_default_kernels_run_and_gradients_flow():
    layers = _layers()
    x = torch.randn(5, 48, requires_grad=True)
    with PackedLinears(layers, batch_hint=5):
        y = layers(x)
    y.sum().backward()
    x64 = x.detach().double().requires_grad_()
    _reference(layers, x64).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)


def test_an_edited_weight_is_packed_again():
    layers = _layers()
    x = torch.randn(4, 48)
    with torch.no_grad():
        with PackedLinears(layers, batch_hint=4):
            layers(x)
        layers[0].weight.mul_(-2.0)  # bumps the weight's version counter
        with PackedLinears(layers, batch_hint=4):
            y = layers(x)
    torch.testing.assert_close(y.double(), _reference(layers, x), atol=1e-5, rtol=1e-5)


def test_weights_other_than_float32_are_refused_with_the_dtype_named():
    with pytest.raises(ValueError, match="torch.float64 weight"):
        PackedLinears(_layers().double(), batch_hint=4)
    with pytest.raises(ValueError, match="no nn.Linear"):
        PackedLinears(nn.GELU(), batch_hint=4)


@pytest.mark.parametrize("mode", ["parallel", "markov", "selector"])
def test_greedy_decoding_on_packed_verify_kernels_equals_generate(mode):
    model = make_tiny_qwen3(vocab_size=48, hidden_size=32, num_layers=4, seed=3)
    target = FrozenTarget(model, target_layer_ids=[1, 3])
    config = DrafterConfig(block_size=4, mask_token_id=47, markov_head=MarkovHeadConfig(kind="gated", rank=8))
    torch.manual_seed(0)
    drafter = DSparkDrafter.for_target(config, target).eval()
    g = torch.Generator().manual_seed(1)
    for trial in range(4):
        prompt = torch.randint(0, 47, (1, 4 + trial), generator=g)
        prompt[0, 1] = 0  # the pad id inside a prompt: the reference must still attend to it
        reference = greedy_reference(model, prompt, 11, eos=[])
        default, _ = speculative_generate(target, drafter, prompt, 11, mode=mode, k=4, eos_token_id=[])
        packed, stats = speculative_generate(
            target, drafter, prompt, 11, mode=mode, k=4, eos_token_id=[], packed_verify=True
        )
        assert torch.equal(packed, reference) and torch.equal(default, reference), (mode, trial)
        assert stats.target_forwards >= 1 and stats.new_tokens == 11
    assert not any("forward" in m.__dict__ for m in model.modules())  # the baseline model is left as it was


def test_the_packed_verify_forward_gives_every_head_row_against_a_float64_reference():
    model = make_tiny_qwen3(vocab_size=48, hidden_size=32, num_layers=4, seed=5)
    target = FrozenTarget(model, target_layer_ids=[1, 3])
    drafter = DSparkDrafter.for_target(DrafterConfig(block_size=4, mask_token_id=47), target).eval()
    tokens = torch.randint(0, 47, (1, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(input_ids=tokens).logits[0, 6:]  # the 5 verified rows
        forwards = TargetForwards(target, drafter, packed_verify=True)
        forwards.prefill(tokens[:, :6])
        logits, features = forwards.verify(tokens[:, 6:], 6)
    assert forwards.own_head and isinstance(logits, torch.Tensor)  # one packed head call over all rows
    assert logits.shape == (5, 48) and features.shape[1] == 5
    torch.testing.assert_close(logits.double(), reference, atol=1e-4, rtol=1e-4)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_the_verify_cost_model_times_the_packed_forward(monkeypatch):
    model = make_tiny_qwen3(vocab_size=48, hidden_size=32, num_layers=2, seed=0)
    # a virtual clock: each decoder forward over m tokens lasts 0.15 + 0.05 m seconds, so the verify forward over
    # n + 1 tokens lasts T(n) = 0.2 + 0.05 n; the 8-token prompt forward before it (0.55 s) must not be timed
    now = [0.0]

    def advance(module, args, kwargs):
        now[0] += 0.15 + 0.05 * kwargs["input_ids"].shape[1]

    handle = model.model.register_forward_pre_hook(advance, with_kwargs=True)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(cost_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
            t0, t1 = measure_verify_cost(model, prompt_length=8, max_block=3, repeats=2, packed_verify=True)
    finally:
        handle.remove()
    assert (t0, t1) == pytest.approx((0.2, 0.05))
    assert not any("forward" in m.__dict__ for m in model.modules())
    # the packed path is really taken: it refuses what PackedLinears refuses, where the default path would time it
    measure_verify_cost(model.double(), prompt_length=8, max_block=2, repeats=1)
    with pytest.raises(ValueError, match="torch.float64 weight"):
        measure_verify_cost(model, prompt_length=8, max_block=2, repeats=1, packed_verify=True)


def test_a_stretch_of_load_during_the_cost_measurement_does_not_bend_the_fit(monkeypatch):
    """Five consecutive verify forwards run 10x slower (another process took the core): every round times each n
    once, so the stretch slows at most two of each n's five samples and the medians keep T(n) = 0.2 + 0.05 n. Timing
    all repeats of one n before the next put the whole stretch on one or two n (the fit then gave a slope of 0)."""
    model = make_tiny_qwen3(vocab_size=48, hidden_size=32, num_layers=2, seed=0)
    now, verifies = [0.0], [0]

    def advance(module, args, kwargs):
        tokens = kwargs["input_ids"].shape[1]
        slow = 1.0
        if tokens <= 5:  # a verify forward (the prompt has 8 tokens)
            verifies[0] += 1
            slow = 10.0 if 6 <= verifies[0] < 11 else 1.0
        now[0] += slow * (0.15 + 0.05 * tokens)

    handle = model.model.register_forward_pre_hook(advance, with_kwargs=True)
    try:
        monkeypatch.setattr(cost_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
        t0, t1 = measure_verify_cost(model, prompt_length=8, max_block=4, repeats=5)
    finally:
        handle.remove()
    assert (t0, t1) == pytest.approx((0.2, 0.05))
