"""The default optimizer and learning-rate schedule of ``DSparkModule`` (each replaceable from the CLI)."""

from __future__ import annotations

import contextlib
import math
from typing import Literal

import torch
import torch.optim._muon as torch_muon

from dspark_lightning.machine import fast_bf16


def default_optimizer(params):
    return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0)


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1):
    """Linear warm-up to the optimizer's lr, then cosine decay to ``min_lr_ratio`` of it at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def muon_parameter(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon trains this drafter parameter: a 2-D weight of the backbone (its layers and the context fusion);
    embeddings, norms, biases, the Markov, confidence and draft LM heads stay on AdamW."""
    return name.startswith("backbone.") and parameter.ndim == 2


def newton_schulz_float32(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float):
    """``torch.optim.Muon``'s orthogonalization (the same quintic Newton-Schulz iteration) in float32 instead of
    bfloat16: on a CPU without a bf16 matmul instruction bf16 runs 20-25x slower than fp32 (576 x 1,536: 6.8 s
    against 0.3 s on an AVX2 EPYC), which made a Muon step cost 30 s there."""
    a, b, c = ns_coefficients
    x = grad.float()
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if transposed else x).to(grad.dtype)


@contextlib.contextmanager
def _orthogonalize_in_float32():
    """Runs ``torch.optim.Muon.step`` with :func:`newton_schulz_float32` (torch casts to bf16 inside a private
    function that its step looks up at call time; there is no option for it)."""
    original = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = newton_schulz_float32
    try:
        yield
    finally:
        torch_muon._zeropower_via_newtonschulz = original


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the backbone's weight matrices and ``AdamW`` on every other parameter, as one optimizer
    (speculators' default recipe: Muon at about 10x the AdamW learning rate).

    Takes ``named_parameters()`` (``DSparkModule.configure_optimizers`` passes them); ``param_groups`` are the two
    inner optimizers' groups, so an LR scheduler scales both. ``configs/recipe_choices/muon.yaml`` selects it.
    ``newton_schulz_dtype``: the dtype of Muon's orthogonalization; ``auto`` is torch's bfloat16 on a GPU or a CPU with
    AMX-BF16 / AVX512-BF16, float32 elsewhere (:func:`newton_schulz_float32`)."""

    def __init__(
        self,
        params,
        lr: float = 6e-3,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        adamw_lr: float = 6e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_weight_decay: float = 0.0,
        newton_schulz_dtype: Literal["auto", "bfloat16", "float32"] = "auto",
    ) -> None:
        named = list(params)
        if not all(isinstance(item, tuple) and len(item) == 2 for item in named):
            raise ValueError("MuonAdamW needs (name, parameter) pairs, as named_parameters() gives")
        matrices = [(n, p) for n, p in named if muon_parameter(n, p)]
        others = [(n, p) for n, p in named if not muon_parameter(n, p)]
        if not matrices:
            raise ValueError("MuonAdamW: no backbone weight matrix among the parameters for Muon to train")
        self.muon = torch.optim.Muon(matrices, lr=lr, momentum=momentum, weight_decay=weight_decay)
        if newton_schulz_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(
                f"MuonAdamW: newton_schulz_dtype must be auto, bfloat16 or float32, got {newton_schulz_dtype!r}"
            )
        if newton_schulz_dtype == "auto":
            on_gpu = matrices[0][1].device.type != "cpu"
            newton_schulz_dtype = "bfloat16" if on_gpu or fast_bf16() else "float32"
        self.newton_schulz_dtype = newton_schulz_dtype
        self.adamw = (
            torch.optim.AdamW(others, lr=adamw_lr, betas=adamw_betas, weight_decay=adamw_weight_decay)
            if others
            else None
        )
        self.inner = [self.muon] + ([self.adamw] if self.adamw is not None else [])
        super().__init__([p for _, p in named], {"lr": lr})
        self.param_groups = [group for optimizer in self.inner for group in optimizer.param_groups]

    @property
    def state(self):  # what Lightning and torch read (e.g. to move state to a device)
        merged = {}
        for optimizer in getattr(self, "inner", []):
            merged.update(optimizer.state)
        return merged

    @state.setter
    def state(self, value) -> None:  # torch.optim.Optimizer.__init__ assigns an empty state: kept by the inner ones
        pass

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with _orthogonalize_in_float32() if self.newton_schulz_dtype == "float32" else contextlib.nullcontext():
            self.muon.step()
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.inner:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"inner": [optimizer.state_dict() for optimizer in self.inner]}

    def load_state_dict(self, state_dict: dict) -> None:
        for optimizer, state in zip(self.inner, state_dict["inner"], strict=True):
            optimizer.load_state_dict(state)
        self.param_groups = [group for optimizer in self.inner for group in optimizer.param_groups]
