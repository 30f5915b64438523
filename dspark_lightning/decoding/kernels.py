"""Packed small-batch linear kernels (``PackedLinears``) for the verify forward of a CPU target.

Why, when it pays and what it costs (opt-in, float32 CPU weights only): docs/design/design.md §8.5."""

from __future__ import annotations

import weakref

import torch
from torch import nn

_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple[int, int, int, torch.Tensor]] = weakref.WeakKeyDictionary()


def packed_kernels_available() -> bool:
    """Whether this torch build has oneDNN's weight reorder and packed linear (CPU builds with mkldnn)."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def _packed_weight(linear: nn.Linear, batch_hint: int) -> torch.Tensor:
    weight = linear.weight
    key = (weight.data_ptr(), weight._version, batch_hint)  # a replaced or edited weight is packed again
    cached = _PACKED.get(linear)
    if cached is None or cached[:3] != key:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        _PACKED[linear] = cached = (*key, packed)
    return cached[3]


class PackedLinears:
    """``with PackedLinears(body, batch_hint=9): body(...)`` runs every ``nn.Linear`` of ``body`` on packed weights.

    Args:
        module: the decoder (e.g. ``model.model`` of a Hugging Face causal LM); every ``nn.Linear`` inside it is
            packed, so pass the body without the LM head.
        batch_hint: the number of rows the packed layout is tuned for (the verify length B + 1); other row counts
            stay correct, only the tuning differs.
    """

    def __init__(self, module: nn.Module, batch_hint: int) -> None:
        if not packed_kernels_available():
            raise RuntimeError(
                "packed_verify needs oneDNN's packed linear (torch.ops.mkldnn._reorder_linear_weight), which this "
                f"torch build ({torch.__version__}) does not have; decode without packed_verify"
            )
        self.linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        if not self.linears:
            raise ValueError(f"packed_verify: {type(module).__name__} has no nn.Linear layers to pack")
        for linear in self.linears:
            weight = linear.weight
            if weight.device.type != "cpu" or weight.dtype != torch.float32:
                raise ValueError(
                    f"packed_verify packs float32 CPU weights; {type(module).__name__} has a {weight.dtype} weight "
                    f"on {weight.device}: decode without packed_verify"
                )
        self.packed = [_packed_weight(linear, batch_hint) for linear in self.linears]

    def __enter__(self) -> PackedLinears:
        for linear, packed in zip(self.linears, self.packed):
            linear.forward = _packed_forward(linear, packed)  # an instance attribute shadows the class method
        return self

    def __exit__(self, *exc) -> None:
        for linear in self.linears:
            linear.__dict__.pop("forward", None)


def _packed_forward(linear: nn.Linear, packed: torch.Tensor):
    default = type(linear).forward.__get__(linear)
    bias = linear.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return default(x)  # the packed op has no backward and packs float32 only
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward
