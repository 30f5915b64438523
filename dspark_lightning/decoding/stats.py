"""What one speculative-decoding run measured: acceptance per step and where the wall time went."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

PHASES = ("prefill", "draft_backbone", "draft_head", "verify", "bookkeeping")


@dataclass
class DecodeStats:
    """Per-step acceptance and per-phase seconds of one ``speculative_generate`` run (or several, ``merge``d).

    Phases of a step: ``draft_backbone`` (the drafter forward: block projections + attention over the context),
    ``draft_head`` (decoding the block - parallel / Markov / Selector walk - and confidence scheduling),
    ``verify`` (the target forward over the block + acceptance), ``bookkeeping`` (cropping the target's KV cache,
    growing the drafter's context, token lists). ``prefill`` is the target's prompt forward plus the drafter's first
    context projection.
    """

    mode: str
    k: int
    temperature: float
    confidence_threshold: float | None
    accepted_per_step: list[int] = field(default_factory=list)  # drafted tokens accepted per verification
    verified_per_step: list[int] = field(default_factory=list)  # drafted tokens sent to verification
    emitted_per_step: list[int] = field(default_factory=list)  # tokens appended per target forward
    # with ``record_blocks``: each step's anchor position (its index in prompt + output) and drafted target ids
    anchor_positions: list[int] = field(default_factory=list)
    drafted_per_step: list[list[int]] = field(default_factory=list)
    draft_backbone_seconds: float = 0.0
    draft_head_seconds: float = 0.0
    verify_seconds: float = 0.0
    bookkeeping_seconds: float = 0.0
    prefill_seconds: float = 0.0
    new_tokens: int = 0

    def record_step(self, drafted: torch.Tensor, accepted: int, emitted: int, anchor_position: int | None) -> None:
        """One verification: ``drafted`` target ids sent, ``accepted`` of them kept, ``emitted`` tokens appended.
        With an ``anchor_position`` (``record_blocks``) the anchor's index and the drafted block are kept too."""
        self.verified_per_step.append(drafted.shape[0])
        self.accepted_per_step.append(accepted)
        self.emitted_per_step.append(emitted)
        if anchor_position is not None:
            self.anchor_positions.append(anchor_position)
            self.drafted_per_step.append(drafted.tolist())

    @property
    def draft_seconds(self) -> float:
        return self.draft_backbone_seconds + self.draft_head_seconds

    @property
    def total_seconds(self) -> float:
        return sum(getattr(self, f"{phase}_seconds") for phase in PHASES)

    @property
    def target_forwards(self) -> int:
        return len(self.emitted_per_step)

    @property
    def tau(self) -> float:
        """Tokens emitted per verifying target forward (the measured acceptance length); NaN (undefined, left out
        of averages) for a run with no verify step, e.g. one whose first token was already an end of sequence."""
        if self.target_forwards == 0:
            return math.nan
        return sum(self.emitted_per_step) / self.target_forwards

    @property
    def mean_verified(self) -> float:
        """Mean number of drafted tokens the target verified per step."""
        return sum(self.verified_per_step) / max(1, len(self.verified_per_step))

    @property
    def tokens_per_second(self) -> float:
        total = self.total_seconds
        return self.new_tokens / total if total > 0 else math.nan

    @property
    def accepted_rate_per_slot(self) -> list[float]:
        """P(slot k accepted | it was verified and every slot before it was accepted) over the run."""
        longest = max(self.verified_per_step, default=0)
        rates = []
        for slot in range(longest):
            tried = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a >= slot)
            ok = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a > slot)
            rates.append(ok / tried if tried else float("nan"))
        return rates

    def phase_ms_per_step(self) -> dict[str, float]:
        """Mean milliseconds per decoding step of each phase (prefill: per run)."""
        steps = max(1, self.target_forwards)
        return {phase: getattr(self, f"{phase}_seconds") * 1e3 / steps for phase in PHASES if phase != "prefill"}

    @classmethod
    def merge(cls, runs: list[DecodeStats]) -> DecodeStats:
        """One record over several runs (e.g. one per prompt): lists concatenated, seconds and tokens summed."""
        if not runs:
            raise ValueError("merge needs at least one DecodeStats")
        first = runs[0]
        merged = cls(first.mode, first.k, first.temperature, first.confidence_threshold)
        for run in runs:
            merged.accepted_per_step += run.accepted_per_step
            merged.verified_per_step += run.verified_per_step
            merged.emitted_per_step += run.emitted_per_step
            merged.anchor_positions += run.anchor_positions
            merged.drafted_per_step += run.drafted_per_step
            merged.new_tokens += run.new_tokens
            for phase in PHASES:
                name = f"{phase}_seconds"
                setattr(merged, name, getattr(merged, name) + getattr(run, name))
        return merged

    def as_dict(self) -> dict:
        return dict(
            mode=self.mode,
            k=self.k,
            temperature=self.temperature,
            confidence_threshold=self.confidence_threshold,
            new_tokens=self.new_tokens,
            target_forwards=self.target_forwards,
            tau=self.tau,
            mean_verified=self.mean_verified,
            draft_seconds=self.draft_seconds,
            **{f"{phase}_seconds": getattr(self, f"{phase}_seconds") for phase in PHASES},
            total_seconds=self.total_seconds,
            tokens_per_second=self.tokens_per_second,
            accepted_rate_per_slot=self.accepted_rate_per_slot,
        )


class PhaseClock:
    """Adds the wall time of each decoding phase to a ``DecodeStats``: ``start()``, then ``lap(phase)`` at the end
    of each phase. On CUDA every reading synchronises, so that a phase is charged for its own kernels, not for the
    queue it inherited."""

    def __init__(self, stats: DecodeStats, device: torch.device) -> None:
        self.stats = stats
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.last = 0.0

    def _now(self) -> float:
        self.sync()
        return time.perf_counter()

    def start(self) -> None:
        self.last = self._now()

    def lap(self, phase: str) -> None:
        """Charge the time since the last reading to ``phase`` (one of ``PHASES``)."""
        now = self._now()
        name = f"{phase}_seconds"
        setattr(self.stats, name, getattr(self.stats, name) + now - self.last)
        self.last = now


@dataclass(frozen=True)
class PromptDecodeRecord:
    """What decoding one prompt of an evaluation set measured.

    ``accepted_per_slot[k]``: in how many of this prompt's verification steps drafted slot ``k`` was accepted.
    ``baseline_seconds`` / ``speculative_seconds``: wall time of the target's own greedy generate and of speculative
    decoding on this prompt (both or neither). ``outputs_equal``: whether the two outputs were equal token for
    token (None: not compared); ``output_tie``: they differed by a float tie only (``measuring.ties``), which
    ``outputs_equal`` counts as equal. ``packed_generate_seconds``: the target's greedy generate on the packed kernels the
    speculative run verified with (``measure_speedup(packed_verify=True)``), else None.
    """

    emitted_tokens: int
    target_forwards: int
    accepted_per_slot: list[int] = field(default_factory=list)
    baseline_seconds: float | None = None
    speculative_seconds: float | None = None
    outputs_equal: bool | None = None
    packed_generate_seconds: float | None = None
    output_tie: bool = False

    def __post_init__(self) -> None:
        if self.target_forwards < 1 or self.emitted_tokens < 0:
            raise ValueError(
                f"a prompt needs target_forwards >= 1 and emitted_tokens >= 0, got {self.target_forwards} and "
                f"{self.emitted_tokens}"
            )
        if any(count < 0 or count > self.target_forwards for count in self.accepted_per_slot):
            raise ValueError(f"accepted_per_slot counts must lie in [0, target_forwards]: {self.accepted_per_slot}")
        if (self.baseline_seconds is None) != (self.speculative_seconds is None):
            raise ValueError("give both baseline_seconds and speculative_seconds, or neither")
        if self.packed_generate_seconds is not None and self.speculative_seconds is None:
            raise ValueError("packed_generate_seconds needs the speculative_seconds it is compared with")

    @property
    def has_timing(self) -> bool:
        return self.baseline_seconds is not None

    @classmethod
    def from_stats(
        cls,
        stats: DecodeStats,
        *,
        baseline_seconds: float | None = None,
        speculative_seconds: float | None = None,
        outputs_equal: bool | None = None,
        packed_generate_seconds: float | None = None,
        output_tie: bool = False,
    ) -> PromptDecodeRecord:
        """The record of one prompt's ``speculative_generate`` run (its ``DecodeStats``, not a merged one)."""
        longest = max(stats.accepted_per_step, default=0)
        return cls(
            emitted_tokens=sum(stats.emitted_per_step),
            target_forwards=stats.target_forwards,
            accepted_per_slot=[sum(1 for a in stats.accepted_per_step if a > slot) for slot in range(longest)],
            baseline_seconds=baseline_seconds,
            speculative_seconds=speculative_seconds,
            outputs_equal=outputs_equal,
            packed_generate_seconds=packed_generate_seconds,
            output_tie=output_tie,
        )
