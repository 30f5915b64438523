"""Non-finite guard for ``DSparkModule``: a NaN/inf loss or gradient stops training before the update.

A mixin for a LightningModule with a ``drafter``: the loss is checked in ``on_before_backward``, the drafter's
gradients in ``on_before_optimizer_step`` (before clipping and the step), so the weights are never updated with them
and no checkpoint of the diverged state is written. Under fp16 loss scaling inf gradients are the scaler's business.
"""

from __future__ import annotations

import torch

from dspark_lightning.checks import NonFiniteError


class NonFiniteGuard:
    """Raises :class:`NonFiniteError` naming the step (and the bad drafter tensors)."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            raise NonFiniteError(
                f"training loss is {loss.item()} at step {self.global_step}: the run diverged, training stopped before "
                "this update and no checkpoint of it was written (lower model.optimizer.init_args.lr?)"
            )

    def on_before_optimizer_step(self, optimizer) -> None:
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return  # fp16 loss scaling: inf gradients are expected and skipped by the scaler
        named = [(name, p.grad) for name, p in self.drafter.named_parameters() if p.grad is not None]
        if not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):
            return
        bad = [name for name, grad in named if not bool(torch.isfinite(grad).all())]
        raise NonFiniteError(
            f"non-finite gradient at step {self.global_step} in {len(bad)} drafter tensor(s) ({', '.join(bad[:6])}): "
            "training stopped before the optimizer step; no checkpoint of it was written"
        )
