"""The frozen target (verifier): any Hugging Face causal LM, from a hub id or a local directory.

It provides what the drafter consumes, for packed rows of several documents:
  - ``context_features`` [b, S, n*H]: the outputs of decoder layers ``target_layer_ids`` concatenated
    (``hidden_states[i + 1]`` in transformers' convention, index 0 being the embeddings);
  - ``final_hidden`` [b, S, H]: the last hidden state *after* the final norm, so teacher logits are just
    ``lm_head(final_hidden)`` - at the few positions the loss needs, never over all S positions.
Documents packed in one row are kept apart by transformers' packed-sequence support: with no attention mask,
no cache and ``position_ids`` that restart at 0 for every document, the causal mask becomes block-diagonal
(tested against running each document alone).

The model is put in eval mode with every parameter frozen; ``train()`` cannot switch it back. Loading never
trusts remote code unless the caller sets ``trust_remote_code=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dspark_lightning.models.backbone import default_target_layer_ids


@dataclass
class TargetFeatures:
    context_features: torch.Tensor
    final_hidden: torch.Tensor


def load_causal_lm(name_or_path: str, dtype: torch.dtype | str = "auto", trust_remote_code: bool = False, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with safe defaults (sdpa attention, no remote code)."""
    from transformers import AutoModelForCausalLM

    kwargs.setdefault("attn_implementation", "sdpa")
    try:
        return AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs
        )
    except OSError as error:
        raise OSError(
            f"could not load target model {name_or_path!r}: give a local directory with config.json and weights, "
            f"or a Hugging Face hub id reachable from this machine ({error})"
        ) from error


class FrozenTarget(nn.Module):
    """Wraps a causal LM; exposes embeddings, LM head, per-layer features and the final hidden state."""

    def __init__(self, model: nn.Module, target_layer_ids: list[int] | None = None, num_draft_layers: int = 1) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self.num_layers = config.num_hidden_layers
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(self.num_layers, num_draft_layers)
        for layer_id in target_layer_ids:
            if not 0 <= layer_id < self.num_layers:
                raise ValueError(f"target layer id {layer_id} out of range for a {self.num_layers}-layer target")
        self.target_layer_ids = list(target_layer_ids)
        model.eval()
        model.requires_grad_(False)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        target_layer_ids: list[int] | None = None,
        num_draft_layers: int = 1,
        dtype: torch.dtype | str = torch.float32,
        trust_remote_code: bool = False,
    ) -> FrozenTarget:
        return cls(load_causal_lm(name_or_path, dtype, trust_remote_code), target_layer_ids, num_draft_layers)

    def train(self, mode: bool = True) -> FrozenTarget:  # the target never leaves eval mode
        return super().train(False)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> TargetFeatures:
        """Run the target over packed rows (documents separated by restarting ``position_ids``)."""
        outputs = getattr(self.model, self.model.base_model_prefix)(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, output_hidden_states=True
        )
        hidden_states = outputs.hidden_states
        context = torch.cat([hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)
        return TargetFeatures(context_features=context, final_hidden=outputs.last_hidden_state)
