"""Reusable CPU scratch buffers for the Selector's large intermediates when autograd is off.

Why (page faults on every call) and what uses them: docs/design/design.md §6.2."""

from __future__ import annotations

import threading

import torch

_LOCAL = threading.local()  # one set of buffers per thread: concurrent callers never share one


def scratch(name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
    """An uninitialised reusable tensor of ``shape`` (dtype and device of ``like``), or None to allocate as usual.

    None when autograd is on (``out=`` ops record no graph) or off the CPU (the CUDA caching allocator already reuses
    memory). One buffer is kept per ``name``: a call with another shape replaces it, so what is held stays bounded by
    the largest recent call. The caller must not let the tensor escape: the next call with that name overwrites it.
    """
    if torch.is_grad_enabled() or like.device.type != "cpu":
        return None
    buffers = _LOCAL.__dict__.setdefault("buffers", {})
    # inference-mode tensors cannot be written outside inference mode (and the reverse would make them inference ones)
    key = (tuple(shape), like.dtype, torch.is_inference_mode_enabled())
    held = buffers.get(name)
    if held is None or held[0] != key:
        held = (key, torch.empty(shape, dtype=like.dtype))
        buffers[name] = held
    return held[1]


def gather_rows(weight: torch.Tensor, ids: torch.Tensor, name: str) -> torch.Tensor:
    """``F.embedding(ids, weight)`` (rows of a [V, r] table), written into the scratch buffer ``name`` when allowed."""
    out = scratch(name, (*ids.shape, weight.shape[1]), weight)
    if out is None:
        return torch.nn.functional.embedding(ids, weight)
    torch.index_select(weight, 0, ids.reshape(-1), out=out.view(-1, weight.shape[1]))
    return out
