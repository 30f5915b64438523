"""The SmolLM2 recipe's fused AdamW takes the same steps as torch's default per-tensor AdamW (float64)."""

from __future__ import annotations

import torch
import yaml
from helpers.paths import ROOT


def test_recipe_fused_adamw_equals_the_default_loop():
    config = yaml.safe_load((ROOT / "configs/smollm2_sharegpt.yaml").read_text())["model"]["optimizer"]
    assert config["class_path"] == "torch.optim.AdamW" and config["init_args"]["fused"] is True
    loop_args = {k: v for k, v in config["init_args"].items() if k != "fused"}
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 16), (16,), (3, 5, 7)]
    start = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]
    grads = [[torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes] for _ in range(6)]
    results = []
    for args in (config["init_args"], loop_args):
        params = [p.clone().requires_grad_() for p in start]
        optimizer = torch.optim.AdamW(params, **args)
        for step in grads:
            for p, grad in zip(params, step, strict=True):
                p.grad = grad.clone()
            optimizer.step()
        results.append(params)
    for fused, loop in zip(*results, strict=True):
        torch.testing.assert_close(fused, loop, rtol=1e-13, atol=1e-15)
