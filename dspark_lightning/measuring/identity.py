"""Train/serve identity: the training-time forward, replayed over what greedy decoding did, reproduces it exactly.

``record_decode``, ``teacher_forced_blocks`` and ``check_identity``: docs/design/design.md §7.9."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from dspark_lightning.decoding.loop import speculative_generate
from dspark_lightning.metrics import greedy_block_tau
from dspark_lightning.models.backbone import Anchors
from dspark_lightning.selector import selector_walk


@dataclass
class DecodeRecord:
    """One greedy decode of one prompt: what was drafted where, and the text it was verified against."""

    mode: str
    prompt_length: int
    output: list[int]  # prompt + generated tokens, as speculative_generate returned them
    text: list[int]  # prompt + the target's greedy continuation, long enough for every drafted block
    anchor_positions: list[int]
    drafted: list[list[int]]
    accepted: list[int]
    tau: float


@dataclass
class TeacherForcedBlocks:
    """The training forward's blocks at given anchors: drafted target ids and acceptance per block."""

    drafted: torch.Tensor  # [A, B'] target ids, B' = drafted slots (B, or B - 1 in the DFlash convention)
    accepted: list[int]  # leading run of drafted tokens equal to the text, per block
    metric_accepted: list[int]  # the training metric's count (``greedy_block_tau`` - 1: drafted == target argmax)

    @property
    def tau(self) -> float:
        """Mean accepted + 1 per block, computed as ``DecodeStats.tau`` is (tokens over forwards)."""
        return sum(a + 1 for a in self.accepted) / max(1, len(self.accepted))

    @property
    def metric_greedy_tau(self) -> float:
        """The training metric (``val/greedy_tau``) over these blocks."""
        return sum(a + 1 for a in self.metric_accepted) / max(1, len(self.metric_accepted))


@dataclass
class IdentityResult:
    """One mode's train/serve identity check: whether decoding drafted the blocks training scored, and the three tau
    figures that must then agree (measured, teacher-forced, the training metric)."""

    mode: str
    steps: int
    blocks_equal: bool
    first_mismatch: tuple[int, int] | None  # (step, slot) of the first drafted token that differs
    measured_tau: float
    teacher_forced_tau: float
    metric_greedy_tau: float

    @property
    def tau_equal(self) -> bool:
        return self.measured_tau == self.teacher_forced_tau

    @property
    def metric_equal(self) -> bool:
        """The training metric's greedy tau over the replayed blocks equals the measured tau too."""
        return self.measured_tau == self.metric_greedy_tau

    @property
    def ok(self) -> bool:
        return self.blocks_equal and self.tau_equal and self.metric_equal


@torch.no_grad()
def greedy_continuation(target, prompt: list[int], length: int) -> list[int]:
    """prompt + ``length`` greedy target tokens, one forward per token with a KV cache, never stopping at EOS (the
    verify forward of the last block reads past EOS, so must the text). A plain loop rather than ``generate``, whose
    EOS-suppressing processors change the chain."""
    from transformers import DynamicCache

    model = getattr(target, "model", target)
    device = next(model.parameters()).device
    # generate's layout: a linear-attention layer (Qwen3-Next) needs its own cache layer, which a bare DynamicCache lacks
    cache, tokens = DynamicCache(config=model.config), list(prompt)
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    step = torch.tensor([prompt], device=device)
    for _ in range(length):
        logits = model(input_ids=step, use_cache=True, **{cache_kwarg: cache}).logits
        tokens.append(int(logits[0, -1].argmax()))
        step = torch.tensor([[tokens[-1]]], device=device)
    return tokens


def record_decode(
    target,
    drafter,
    prompt: list[int],
    max_new_tokens: int,
    mode: str,
    k: int = 16,
    eos_token_id=None,
    check_lossless: bool = True,
) -> DecodeRecord:
    """Greedy ``speculative_generate`` with ``record_blocks`` plus the text that covers its blocks.

    ``check_lossless`` raises if the output is not the text's prefix (in fp32 it always is; under bf16 a near-tie
    may flip between the two forwards, which a training-time callback must survive)."""
    device = drafter.backbone.fc.weight.device
    output, stats = speculative_generate(
        target,
        drafter,
        torch.tensor([prompt], device=device),
        max_new_tokens,
        mode=mode,
        k=k,
        eos_token_id=eos_token_id,
        record_blocks=True,
    )
    output = output[0].tolist()
    end = max((p + 1 + len(d) for p, d in zip(stats.anchor_positions, stats.drafted_per_step)), default=0)
    # a block after the last output token fits too (the gap table anchors blocks anywhere in the output)
    end = max(end, len(output) + drafter.block_size)
    text = greedy_continuation(target, prompt, end - len(prompt))
    if check_lossless and text[: len(output)] != output:
        raise AssertionError("greedy speculative decoding differs from the target's greedy generate: not lossless")
    return DecodeRecord(
        mode,
        len(prompt),
        output,
        text,
        stats.anchor_positions,
        stats.drafted_per_step,
        stats.accepted_per_step,
        stats.tau,
    )


@torch.no_grad()
def teacher_forced_blocks(
    target,
    drafter,
    text: list[int],
    anchor_positions: list[int],
    supervised_from: int,
    mode: str,
    k: int = 16,
    markov_prev: str = "own",
    loss_mask: list[bool] | None = None,
) -> TeacherForcedBlocks:
    """The training forward over ``text`` (one document) with blocks anchored at ``anchor_positions``.

    Supervised (loss-mask) positions: ``loss_mask`` or every position from ``supervised_from`` on. ``markov_prev``
    applies to ``markov`` mode (``selector`` always walks its own choices, ``parallel`` has no head).
    """
    device = drafter.backbone.fc.weight.device
    S = len(text)
    ids = torch.tensor([text], device=device)
    positions = torch.arange(S, device=device)[None]
    if loss_mask is None:
        mask = positions >= supervised_from
    else:
        mask = torch.tensor([loss_mask], device=device, dtype=torch.bool)
    anchors = Anchors(
        positions=torch.tensor([anchor_positions], device=device, dtype=torch.long).view(1, -1),
        valid=torch.ones(1, len(anchor_positions), dtype=torch.bool, device=device),
    )
    if not anchor_positions:
        return TeacherForcedBlocks(torch.zeros(0, drafter.config.trained_block_size, dtype=torch.long), [], [])
    features = target.features(ids, positions)
    out = drafter(
        ids,
        mask.long(),
        torch.zeros_like(ids),
        positions,
        features.context_features,
        features.final_hidden.to(drafter.lm_head.weight.dtype),
        anchors=anchors,
        markov_prev=markov_prev if mode == "markov" else "teacher",
    )
    trained = out.trained_slots  # one row: [A, B', ...], one block per anchor
    if mode == "selector":
        base_logits, first_prev = trained(out.base_logits), trained(out.prev_tokens)[:, 0]
        walk = selector_walk(base_logits, drafter.markov_head, first_prev, trained(out.hidden), k, d2t=drafter.d2t)
        choice = walk.tokens
    else:
        choice = trained(out.base_logits if mode == "parallel" else out.logits).argmax(-1)
    drafted = choice if drafter.d2t is None else drafter.d2t[choice]
    valid = trained(out.slot_valid)
    matches = (drafted == trained(out.target_tokens)) & valid
    accepted = matches.long().cumprod(-1).sum(-1).tolist()
    # what the training metrics compute: the drafted token against the target's argmax at that position
    metric_match = drafted == trained(out.teacher_argmax)
    metric = (greedy_block_tau(metric_match, valid) - 1).round().long().tolist()
    return TeacherForcedBlocks(drafted.cpu(), accepted, metric)


def check_identity(
    target, drafter, prompt: list[int], max_new_tokens: int, mode: str, k: int = 16, eos_token_id=None
) -> IdentityResult:
    """Decode ``prompt`` greedily, replay it through the training forward at the same anchors, compare."""
    record = record_decode(target, drafter, prompt, max_new_tokens, mode, k, eos_token_id)
    replay = teacher_forced_blocks(
        target, drafter, record.text, record.anchor_positions, record.prompt_length, mode, k, markov_prev="own"
    )
    mismatch = None
    for step, (decoded, forced) in enumerate(zip(record.drafted, replay.drafted.tolist())):
        if decoded != forced:
            slot = (
                next(i for i, (a, b) in enumerate(zip(decoded, forced)) if a != b) if len(decoded) == len(forced) else 0
            )
            mismatch = (step, slot)
            break
    equal = mismatch is None and len(record.drafted) == len(replay.accepted)
    return IdentityResult(
        mode=mode,
        steps=len(record.drafted),
        blocks_equal=equal,
        first_mismatch=mismatch,
        measured_tau=record.tau,
        teacher_forced_tau=replay.tau,
        metric_greedy_tau=replay.metric_greedy_tau,
    )
