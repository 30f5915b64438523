"""``speculative_generate``: the measured speculative-decoding loop (a Hugging Face target + a DSpark drafter, batch
size 1; evaluation, not serving): prefill, then steps of draft, decode in a mode, schedule, verify, commit, each timed.
``_Prefix`` keeps the target's KV cache and the drafter's context cache in step. At temperature 0 the output equals
``target.generate(do_sample=False)`` token for token. Design: docs/design/design.md §8.1-§8.6."""

from __future__ import annotations

import torch

from dspark_lightning.decoding.modes import MODES, draft_block
from dspark_lightning.decoding.schedule import schedule_block
from dspark_lightning.decoding.stats import DecodeStats, PhaseClock
from dspark_lightning.decoding.target_forwards import TargetForwards
from dspark_lightning.decoding.verify import verify_block
from dspark_lightning.dtypes import at_least_float32
from dspark_lightning.models.drafter import DSparkDrafter


class _Prefix:
    """The verified prefix both models hold: the target's KV cache and the drafter's context, which ``prefill``
    fills and ``commit`` grows together, so that both always cover the first ``length`` tokens."""

    def __init__(self, target: TargetForwards, drafter: DSparkDrafter, drafter_cache: bool) -> None:
        self.target, self.drafter, self.drafter_cache = target, drafter, drafter_cache
        self.length = 0
        self.context_cache = None  # the drafter's projected context (``drafter_cache``)
        self.context: torch.Tensor | None = None  # else the target features of every prefix token

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prompt forward; returns the target's logits of the first new token [V]."""
        logits, features = self.target.prefill(prompt)
        if self.drafter_cache:
            capacity = prompt.shape[1] + 2 * self.drafter.block_size
            self.context_cache = self.drafter.new_context_cache(device=prompt.device, capacity=capacity)
            self.context_cache.extend(features)
        else:
            self.context = features
        self.length = prompt.shape[1]
        return logits

    def draft(self, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's block after the prefix, anchored at the newest token ``anchor`` [1]: base logits
        [1, B', Vd] and hidden states [1, B', H] of the drafted slots."""
        position = torch.tensor([self.length], device=anchor.device)
        if self.context_cache is not None:
            base, hidden = self.drafter.draft_cached(self.context_cache, anchor, position)
        else:
            positions = torch.arange(self.length, device=anchor.device)[None]
            base, hidden = self.drafter.draft(self.context, positions, anchor, position)
        return self.drafter.config.trained_slots(base), self.drafter.config.trained_slots(hidden)

    def verify_forward(self, block: torch.Tensor):
        """The target forward over ``block`` = [x, d_1..d_n] [1, n+1] after the prefix: (logits rows, features)."""
        return self.target.verify(block, self.length)

    def commit(self, features: torch.Tensor, accepted: int) -> None:
        """The anchor and the first ``accepted`` drafts join the prefix; the rest leave the target's KV cache."""
        length = self.length + 1 + accepted
        self.target.crop(length)
        kept = features[:, : 1 + accepted]
        if self.context_cache is not None:
            self.context_cache.extend(kept)
        else:
            self.context = torch.cat((self.context, kept), dim=1)
        self.length = length


@torch.no_grad()
def speculative_generate(
    target,
    drafter: DSparkDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    mode: str,
    k: int = 16,
    temperature: float = 0.0,
    confidence_threshold: float | None = None,
    generator: torch.Generator | None = None,
    cost_model: tuple[float, float] | None = None,
    eos_token_id: int | list[int] | None = None,
    drafter_cache: bool = True,
    record_blocks: bool = False,
    packed_verify: bool = False,
) -> tuple[torch.Tensor, DecodeStats]:
    """Speculative generation; returns (prompt + new tokens [1, T], stats). The step: docs/design/design.md §8.1.

    ``target`` is a ``FrozenTarget`` or a Hugging Face causal LM (then ``drafter.config.target_layer_ids`` says
    which layers feed the drafter). ``eos_token_id`` defaults to the target's generation config.
    ``drafter_cache=False`` recomputes the drafter's context projections over the whole prefix at every step.
    ``record_blocks`` keeps each step's anchor position and drafted tokens in the stats (``measuring.identity``
    replays them teacher-forced); off by default because listing the drafted tokens costs a copy per step.
    ``packed_verify`` runs the verify forwards' decoder linears on oneDNN-packed weights (``decoding.kernels``:
    float32 CPU targets; faster at 2-17 rows on AVX2, one more copy of the decoder weights in memory).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"speculative_generate decodes one sequence at a time: input_ids must be [1, T], got {tuple(input_ids.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    target_forwards = TargetForwards(target, drafter, packed_verify)
    if eos_token_id is None:
        eos_token_id = target_forwards.model.generation_config.eos_token_id
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    stats = DecodeStats(mode, k, temperature, confidence_threshold)
    clock = PhaseClock(stats, input_ids.device)
    prefix = _Prefix(target_forwards, drafter, drafter_cache)

    clock.start()
    generated = [_sample(prefix.prefill(input_ids), temperature, generator)]
    clock.lap("prefill")
    while len(generated) < max_new_tokens and generated[-1] not in eos:
        anchor = torch.tensor([generated[-1]], device=input_ids.device)  # charged to drafting: phases cover the run
        base, hidden = prefix.draft(anchor)
        clock.lap("draft_backbone")
        drafted, q = draft_block(drafter, base, hidden, anchor, mode, k, temperature, generator)
        drafted, q = schedule_block(drafter, hidden, anchor, drafted, q, confidence_threshold, cost_model)
        clock.lap("draft_head")
        logits, features = prefix.verify_forward(torch.cat((anchor, drafted))[None])
        accepted, next_token = verify_block(drafted, q, logits, drafter, temperature, generator)
        clock.lap("verify")
        new = drafted[:accepted].tolist() + [next_token]
        stats.record_step(drafted, accepted, len(new), prefix.length if record_blocks else None)
        prefix.commit(features, accepted)
        generated.extend(new)
        clock.lap("bookkeeping")

    generated = _truncate(generated, max_new_tokens, eos)
    stats.new_tokens = len(generated)
    output = torch.cat((input_ids, torch.tensor([generated], device=input_ids.device, dtype=input_ids.dtype)), dim=1)
    return output, stats


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """The target's token from its logits [V]: argmax at temperature 0, else a draw from softmax(logits / T)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(at_least_float32(logits) / temperature, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _truncate(tokens: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Cut at the first EOS (kept) and at ``max_new_tokens``, exactly as ``generate`` stops."""
    for i, token in enumerate(tokens):
        if token in eos:
            tokens = tokens[: i + 1]
            break
    return tokens[:max_new_tokens]
