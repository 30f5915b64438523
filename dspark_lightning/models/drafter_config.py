"""DrafterConfig: what defines a drafter besides its target, and which slots of its blocks are drafted and trained.

``trained_slots`` is the one place the anchor convention (docs/design/design.md §3.1) picks them: all B slots under DSpark's
``sample_from_anchor=True``, slots 1..B-1 under DFlash's (slot 0 holds the anchor's own token, the bonus token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from dspark_lightning.errors import OptionError
from dspark_lightning.models.markov import MarkovHeadConfig


@dataclass(frozen=True)
class DrafterConfig:
    """Everything that defines a drafter besides the target it drafts for (``--model.drafter.*`` in the CLI).

    Frozen: a drafter's config never changes under it; derive a variant with ``dataclasses.replace``."""

    block_size: int = 8
    """Tokens per draft block B (>= 2); linked into the data module."""
    num_layers: int = 1
    """Draft decoder layers."""
    max_anchors: int = 64
    """Blocks sampled per packed row in each training step (A)."""
    sample_from_anchor: bool = True
    """DSpark convention (slot k predicts p+k+1) or DFlash convention (slot k predicts p+k; slot 0 is the bonus token,
    never drafted)."""
    mask_token_id: int | None = None
    """Id of the mask token filling slots 1..B-1 (must exist in the target vocabulary; linked from the data module's
    tokenizer)."""
    target_layer_ids: list[int] | None = None
    """Target decoder layers whose outputs feed the drafter; None = the DFlash default spread over depth."""
    markov_head: MarkovHeadConfig | None = field(default_factory=MarkovHeadConfig)
    """The Markov head (``{kind: gated, rank: 64}``), or None for pure DFlash."""
    confidence_head: bool = True
    """Attach the per-slot acceptance-probability head."""
    confidence_with_markov: bool = True
    """Feed the Markov head's previous-token embedding to the confidence head."""
    draft_vocab: str | None = None
    """Path of a ``.safetensors`` file holding ``d2t`` (a reduced draft vocabulary), or None for the target's."""
    block_embedding: Literal["target", "lookup"] = "target"
    """How block tokens (the anchor and the masks) are embedded: ``target``, with the target's own input-embedding
    module (Gemma multiplies by sqrt(hidden)); ``lookup``, a plain lookup of its weight (the same weight, frozen),
    which is what the speculators DSpark format serves, so a Gemma drafter must use it to be exported. The same on
    a target whose embedding is a plain lookup."""
    train_lm_head: bool = False
    """With a draft vocabulary, train a separate draft LM head (else reuse the target's rows, frozen)."""
    num_heads: int | None = None
    """Draft attention heads; None = the target's (likewise the next three)."""
    num_kv_heads: int | None = None
    """Draft key/value heads; None = the target's."""
    head_dim: int | None = None
    """Draft head dimension; None = the target's."""
    intermediate_size: int | None = None
    """Draft MLP width; None = the target's."""
    attention_backend: str = "auto"
    """``auto`` (flex on CUDA, sdpa otherwise), ``sdpa`` or ``flex``."""
    sliding_window: int | None = None
    """Context window W of the sliding layers: a block anchored at p sees context positions p - W .. p - 1 (its own
    block always, bidirectionally); None = full attention everywhere."""
    layer_types: list[str] | None = None
    """Per draft layer ``full_attention`` or ``sliding_attention``; None = all sliding when ``sliding_window`` is set,
    else all full."""

    def __post_init__(self) -> None:
        if self.block_embedding not in ("target", "lookup"):
            raise OptionError(
                f"model.drafter.block_embedding must be 'target' or 'lookup', got {self.block_embedding!r}"
            )
        if self.block_size < 2:
            raise OptionError(f"model.drafter.block_size must be >= 2, got {self.block_size}")
        if self.num_layers < 1:
            raise OptionError(f"model.drafter.num_layers must be >= 1, got {self.num_layers}")
        if self.sliding_window is not None and self.sliding_window < 1:  # checked before the target loads
            raise OptionError(f"model.drafter.sliding_window must be >= 1 (or null), got {self.sliding_window}")
        if self.max_anchors < 1:
            raise OptionError(f"model.drafter.max_anchors must be >= 1, got {self.max_anchors}")
        markov_head = MarkovHeadConfig.coerce(self.markov_head)
        if markov_head is not None and markov_head.rank == 0:
            markov_head = None  # rank 0 means "no head", as in the DSpark CLI
        object.__setattr__(self, "markov_head", markov_head)  # the one normalisation a frozen config allows itself
        if self.confidence_head and self.confidence_with_markov and self.markov_head is None:
            raise OptionError(
                "model.drafter.confidence_with_markov=true needs a Markov head: set it false "
                "(or add a markov_head) when training pure DFlash"
            )

    @property
    def first_trained_slot(self) -> int:
        """Slots ``first_trained_slot``..B-1 of a block are drafted and trained (1 in the DFlash convention)."""
        return 0 if self.sample_from_anchor else 1

    @property
    def trained_block_size(self) -> int:
        """B': how many slots of a block are drafted and trained."""
        return self.block_size - self.first_trained_slot

    def trained_slots(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The trained slots of a per-slot tensor whose dimension ``dim`` holds a block's B slots (a view; the tensor
        itself when every slot is trained)."""
        if self.first_trained_slot == 0:  # every slot: the tensor itself, so autograd adds no zero-filled slice grad
            return t
        return t.narrow(dim, self.first_trained_slot, self.trained_block_size)

    def untrained_slots(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The other slots (the DFlash bonus slot, or none) of such a tensor (a view)."""
        return t.narrow(dim, 0, self.first_trained_slot)
