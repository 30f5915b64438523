"""Optional reduced draft vocabulary (Vd < V): the d2t / t2d maps between draft indices and target ids.

The file and the selection: docs/design/data.md §6.3; export as offsets: §6.4."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from torch import nn

from dspark_lightning.errors import OptionError


class DraftVocab(nn.Module):
    """Holds d2t [Vd] and t2d [V] as buffers so they travel with the drafter's state dict.

    The file it is read from (``load_draft_vocab``) and how it is chosen: docs/design/data.md §6.3.

    Args:
        d2t: [Vd] target ids of the draft vocabulary (distinct; stored sorted, so draft index i is the i-th lowest).
        verifier_vocab_size: V, the length of the boolean ``t2d`` mask built from ``d2t``.
    """

    def __init__(self, d2t: torch.Tensor, verifier_vocab_size: int) -> None:
        super().__init__()
        d2t = torch.as_tensor(d2t, dtype=torch.long)
        if d2t.ndim != 1 or d2t.numel() == 0:
            raise ValueError("d2t must be a non-empty 1-D tensor of target ids")
        if int(d2t.min()) < 0 or int(d2t.max()) >= verifier_vocab_size:
            raise ValueError(
                f"d2t ids must lie in [0, {verifier_vocab_size}), got [{int(d2t.min())}, {int(d2t.max())}]"
            )
        if torch.unique(d2t).numel() != d2t.numel():
            raise ValueError("d2t contains repeated target ids")
        d2t = torch.sort(d2t).values
        t2d = torch.zeros(verifier_vocab_size, dtype=torch.bool)
        t2d[d2t] = True
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)

    @property
    def draft_vocab_size(self) -> int:
        return self.d2t.numel()

    @property
    def verifier_vocab_size(self) -> int:
        return self.t2d.numel()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.d2t[draft_ids]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft index of each target id; -1 where the id is not in the draft vocabulary."""
        index = torch.full((self.verifier_vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        index[self.d2t] = torch.arange(self.draft_vocab_size, device=self.d2t.device)
        return index[target_ids]

    @classmethod
    def from_counts(
        cls, counts: torch.Tensor, draft_vocab_size: int, always_include: list[int] | tuple[int, ...] = ()
    ) -> DraftVocab:
        """Top ``draft_vocab_size`` ids by count (ties -> lower id), forcing ``always_include`` in."""
        counts = torch.as_tensor(counts, dtype=torch.float64).clone()
        V = counts.numel()
        if not 1 <= draft_vocab_size <= V:
            raise ValueError(f"draft_vocab_size must be in [1, {V}], got {draft_vocab_size}")
        if len(set(always_include)) > draft_vocab_size:
            raise ValueError("more always-included ids than the draft vocabulary has room for")
        counts[list(always_include)] = float("inf")
        # by count descending, then id ascending (a stable sort keeps equal counts in id order); one tensor sort, not a
        # Python sort over V elements (0.5 s at Gemma 3's V = 262,144)
        order = torch.sort(-counts, stable=True).indices
        return cls(order[:draft_vocab_size], V)


def load_draft_vocab(path: str, verifier_vocab_size: int) -> DraftVocab:
    """Read ``d2t`` (absolute target ids) from a safetensors file written by ``dspark-lightning draft-vocab``."""
    try:
        tensors = load_file(path)
    except Exception as error:  # noqa: BLE001 - re-raised with the file name
        raise OptionError(f"model.drafter.draft_vocab: could not read draft vocabulary {path!r}: {error}") from error
    if "d2t" not in tensors:
        raise ValueError(f"draft vocabulary file {path!r} has no 'd2t' tensor (found {sorted(tensors)})")
    return DraftVocab(tensors["d2t"], verifier_vocab_size)
