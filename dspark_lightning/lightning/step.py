"""What one training/evaluation step of ``DSparkModule`` returns, and the per-step metric helpers it logs with."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torchmetrics

from dspark_lightning.lightning.config import LossArgs
from dspark_lightning.losses import compound_loss, confidence_loss, position_weights
from dspark_lightning.models import DrafterOutput, DSparkDrafter
from dspark_lightning.selector import candidate_loss


@dataclass
class StepOutput:
    """What one ``shared_step`` computes. Per-slot tensors are [N_blocks, B'] over the trained slots only (slot 0 is
    dropped in the DFlash convention, so B' = ``DrafterConfig.trained_block_size``)."""

    loss: torch.Tensor  # the differentiable total loss
    losses: dict[str, torch.Tensor]  # detached components for logging (``loss``, ``loss_tv``, ``loss_confidence`` ...)
    alpha: torch.Tensor  # per-slot acceptance probability of the drafted token
    greedy_match: torch.Tensor  # per-slot: the drafter's argmax equals the target's
    valid: torch.Tensor  # per-slot supervision mask
    confidence: torch.Tensor | None  # per-slot predicted acceptance (sigmoid), None without a confidence head
    drafter_output: DrafterOutput  # the full drafter forward (anchors, logits, hidden ...)

    def trained_slots(self, t: torch.Tensor) -> torch.Tensor:
        """A drafter-output tensor [rows, blocks, B, ...] as [N_blocks, B', ...] over the trained slots."""
        return self.drafter_output.trained_slots(t)


class AnchorCoverage(torchmetrics.Metric):
    """Supervised positions predicted by some block / all supervised positions (sum states: exact under DDP)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("covered", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("supervised", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, covered: torch.Tensor, supervised: torch.Tensor) -> None:
        self.covered += covered
        self.supervised += supervised

    def compute(self) -> torch.Tensor:
        return self.covered.float() / self.supervised.clamp(min=1).float()


def step_output(out: DrafterOutput, loss_args: LossArgs, loss_spec: dict, drafter: DSparkDrafter) -> StepOutput:
    """Losses and per-slot acceptance of one drafter forward ``out`` under the loss options ``loss_args``.

    The compound loss (chunked, analytic gradient) + ``confidence_alpha`` x the confidence BCE on the detached
    acceptance + ``candidate_weight`` x the Selector candidate loss; per-slot outputs keep the trained slots
    (``DrafterConfig.trained_slots``).
    """
    block_size = drafter.config.block_size
    num_blocks = out.logits.shape[0] * out.logits.shape[1]
    weights = position_weights(
        block_size,
        position_weighting=loss_args.position_weighting,
        gamma=loss_args.gamma,
        sample_from_anchor=drafter.config.sample_from_anchor,
        device=out.logits.device,
    )
    valid = out.slot_valid.view(num_blocks, block_size)
    loss_out = compound_loss(
        out.logits.reshape(num_blocks, block_size, -1),
        out.teacher_table,
        weights,
        valid,
        loss_spec,
        loss_args.chunk_size,
        position_weighting=loss_args.position_weighting,
        block_size=block_size,
        lk_eta=loss_args.lk_eta,
        nla_alpha_min=loss_args.nla_alpha_min,
        teacher_rows=out.teacher_rows,
    )
    total = loss_out.loss
    # greedy verification accepts the target's own argmax: compare in target ids over the whole vocabulary (with a
    # draft vocabulary, the argmax of the draft-vocab teacher is merely the best draft token)
    vocab = drafter.draft_vocab
    draft_argmax = loss_out.draft_argmax if vocab is None else vocab.to_target(loss_out.draft_argmax)
    greedy_match = (draft_argmax == out.teacher_argmax.reshape(num_blocks, block_size)).view(
        loss_out.greedy_match.shape
    )
    losses = {f"loss_{name}": value for name, value in loss_out.components.items()}
    confidence = None
    if out.confidence_logits is not None:
        conf_logits = out.confidence_logits.reshape(num_blocks, block_size)
        conf = confidence_loss(conf_logits, loss_out.alpha, loss_out.weights, valid)
        total = total + loss_args.confidence_alpha * conf
        losses["loss_confidence"] = conf.detach()
        confidence = torch.sigmoid(conf_logits.detach().float())
    if loss_args.candidate_weight > 0:
        vocab, target_ids = drafter.draft_vocab, out.target_tokens.flatten(0, 1)
        cand, recall = candidate_loss(
            out.base_logits.flatten(0, 1),
            drafter.markov_head,
            out.prev_tokens.flatten(0, 1),
            out.hidden.flatten(0, 1),
            target_ids if vocab is None else vocab.to_draft(target_ids),
            loss_args.candidate_k,
            valid,
            rule=loss_args.candidate_rule,
        )
        total = total + loss_args.candidate_weight * cand
        losses["loss_candidate"] = cand.detach()
        losses[f"candidate_recall@{loss_args.candidate_k}"] = recall.recall.detach().float()
    losses["loss"] = total.detach()
    view = lambda t: None if t is None else drafter.config.trained_slots(t)  # noqa: E731
    return StepOutput(
        loss=total,
        losses=losses,
        alpha=view(loss_out.alpha),
        greedy_match=view(greedy_match),
        valid=view(valid),
        confidence=view(confidence),
        drafter_output=out,
    )


def flatten_metrics(values: dict[str, torch.Tensor], stage: str) -> dict[str, float]:
    """``acceptance/accept_rate_per_slot`` [block_size] -> ``val/accept_rate/slot_0`` ...; scalars -> ``val/tau`` ..."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        group, name = key.split("/", 1)
        prefix = f"{stage}/" if group == "acceptance" else f"{stage}/confidence/"
        if name.startswith("reliability_"):
            continue  # curves are drawn by the calibration callback, not logged as scalars
        if value.ndim == 0:
            flat[prefix + name] = float(value)
        elif name.endswith("_per_slot"):
            base = name.removesuffix("_per_slot")
            for slot, v in enumerate(value.tolist()):
                if not math.isnan(v):
                    flat[f"{prefix}{base}/slot_{slot}"] = v
    return flat


@torch.no_grad()
def evaluation_steps(module, dataloader, max_batches: int | None = None) -> Iterator[StepOutput]:
    """``module.shared_step`` on each batch (moved to the module's device) at the deterministic evaluation anchors:
    the same blocks the validation metrics use. The one loop behind every offline block collection."""
    for index, batch in enumerate(dataloader):
        if max_batches is not None and index >= max_batches:
            return
        batch = {k: v.to(module.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        yield module.shared_step(batch, anchors=module.evaluation_anchors(batch))
