"""``SpeculativeDecodingCallback``: real speculative decoding at validation end, during training, next to the
teacher-forced metrics (the train/serve gap), and the named eval sets measured the way ``decode --eval_sets`` does."""

from __future__ import annotations

import logging

import lightning as L

from dspark_lightning.decoding import supported_modes
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.callbacks import parameters_sharded, this_validation_tau
from dspark_lightning.measuring.eval_set_summary import summarize_eval_set
from dspark_lightning.measuring.eval_sets import (
    KNOWN_EVAL_SETS,
    EvalSetName,
    datamodule_prompt_ids,
    unknown_eval_sets,
)
from dspark_lightning.measuring.identity import record_decode, teacher_forced_blocks
from dspark_lightning.measuring.in_training import decode_eval_set, eval_set_metrics
from dspark_lightning.measuring.results import EvalSetSummary
from dspark_lightning.measuring.turns import Prompt
from dspark_lightning.progress import stop_requested

log = logging.getLogger(__name__)


class SpeculativeDecodingCallback(L.Callback):
    """At validation end, real speculative decoding on a few eval prompts with the target: the train/serve gap.

    Logs ``val/decode/<mode>/tau`` (measured tokens per target forward, greedy) next to the teacher-forced
    ``val/tau``, and ``val/decode/<mode>/gap`` = teacher-forced tau - measured tau, both of the same validation
    (``this_validation_tau``). On-policy:
    ``val/decode/<mode>/on_policy_greedy_tau`` is the training metric (greedy tau) on the target's own replies to the
    same prompts with a block at every reply position, and ``on_policy_gap`` = it - measured tau, what decoding's
    anchor placement costs (``measuring.gap``). Prompts come from the data
    module's ``eval_prompts()``. Runs on global rank 0 only (the numbers are logged without sync). It prints one
    line when it starts, and a SIGTERM (``trainer.received_sigterm``) stops it before the next prompt, so a run
    under ``timeout`` ends within seconds instead of after the whole decode.

    With ``eval_sets`` it also measures the first ``eval_set_limit`` prompts of each named evaluation set
    (``measuring/eval_sets.py``, the sets of ``decode --eval_sets``; docs/design/design.md §7.8) in each mode and logs
    ``val/decode/<set>/<mode>/tau`` with its 95% bootstrap interval over prompts (``.../tau_ci_low``,
    ``.../tau_ci_high``) and ``.../num_prompts`` (``measuring/in_training.py``); the summaries of the last
    validation are kept in ``last_eval_sets`` (``EvalSetSummary``; the step in ``last_eval_sets_step``).
    ``sharegpt_heldout`` reads ``heldout_files`` (default: the data module's ``val_files``) and keeps what ``heldout_split_by_id`` (default: ``data.split_by_id``) assigns to
    validation. The sets are loaded when fit or validate starts, so a missing or malformed set fails before training.
    ``num_prompts: 0`` measures the eval sets only. In a LightningCLI YAML::

        - class_path: dspark_lightning.measuring.callback.SpeculativeDecodingCallback
          init_args:
            modes: [markov]
            eval_sets: [sharegpt_heldout, humaneval]
            eval_set_limit: 8
    """

    def __init__(
        self,
        modes: tuple[str, ...] = ("parallel", "markov", "selector"),
        num_prompts: int = 4,
        max_new_tokens: int = 48,
        k: int = 16,
        eval_sets: list[EvalSetName] | None = None,
        eval_set_limit: int = 8,
        heldout_files: str | None = None,
        heldout_split_by_id: dict[str, float] | None = None,
    ) -> None:
        self.modes, self.num_prompts, self.max_new_tokens, self.k = list(modes), num_prompts, max_new_tokens, k
        if num_prompts < 0:
            raise OptionError(f"SpeculativeDecodingCallback num_prompts must be >= 0, got {num_prompts}")
        if eval_set_limit < 1:
            raise OptionError(f"SpeculativeDecodingCallback eval_set_limit must be >= 1, got {eval_set_limit}")
        # the names only: the files are read in setup, before the first step (an error raised here, inside
        # jsonargparse's instantiation of the callbacks list, would reach the user as a union-type parse error)
        unknown = unknown_eval_sets(eval_sets or ())
        if unknown:
            raise OptionError(
                f"SpeculativeDecodingCallback eval_sets: unknown eval sets {unknown}; known: {KNOWN_EVAL_SETS}"
            )
        self.eval_sets, self.eval_set_limit = list(eval_sets or ()), eval_set_limit
        self.heldout_files, self.heldout_split_by_id = heldout_files, heldout_split_by_id
        self.eval_set_prompts: dict[str, list[Prompt]] = {}
        self.last_eval_sets: list[EvalSetSummary] = []
        self.last_eval_sets_step: int | None = None  # the global step they were measured at

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.eval_sets or stage not in ("fit", "validate") or trainer.datamodule is None:
            return
        if not hasattr(pl_module.target, "model"):
            log.warning(
                "SpeculativeDecodingCallback: no target decoder (cache features), the eval sets are not measured"
            )
            return
        self.eval_set_prompts = {
            name: datamodule_prompt_ids(
                trainer.datamodule, name, self.eval_set_limit, self.heldout_files, self.heldout_split_by_id
            )
            for name in self.eval_sets
        }

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.datamodule is None:
            return
        if parameters_sharded(trainer) or not hasattr(pl_module.target, "model"):
            # FSDP (sharded target), or cache mode (model.target.features=cache): no target decoder to verify drafts with
            return
        teacher_tau = this_validation_tau(pl_module)  # on every rank: computing the metric syncs it across ranks
        if not trainer.is_global_zero:
            return
        prompts = trainer.datamodule.eval_prompts()[: self.num_prompts] if self.num_prompts else []
        modes = [mode for mode in self.modes if mode in supported_modes(pl_module.drafter.markov_head)]
        sets = "".join(f", eval set {name} ({len(p)} prompts)" for name, p in self.eval_set_prompts.items())
        print(
            f"SpeculativeDecodingCallback: decoding {len(prompts)} prompts{sets} x {len(modes)} modes, up to "
            f"{self.max_new_tokens} new tokens each, at step {trainer.global_step} (SIGTERM stops it between prompts)",
            flush=True,
        )
        for mode in modes if prompts else []:
            measured = self._decode(trainer, pl_module, prompts, mode)
            if measured is None:
                print("SpeculativeDecodingCallback: stopped on SIGTERM, the rest of this decode is skipped", flush=True)
                return
            tau, on_policy_tau = measured
            pl_module.log(f"val/decode/{mode}/tau", tau, rank_zero_only=True)
            if on_policy_tau is not None:
                pl_module.log(f"val/decode/{mode}/on_policy_greedy_tau", on_policy_tau, rank_zero_only=True)
                # what decoding's anchor placement costs (experiments/demo_heads/gap.md, step (c) -> (d))
                pl_module.log(f"val/decode/{mode}/on_policy_gap", on_policy_tau - tau, rank_zero_only=True)
            if teacher_tau is not None and mode in ("markov", "parallel"):
                pl_module.log(f"val/decode/{mode}/gap", teacher_tau - tau, rank_zero_only=True)
        self._decode_eval_sets(trainer, pl_module, modes)

    def _decode_eval_sets(self, trainer, pl_module, modes: list[str]) -> None:
        """Each eval set in each mode: its tau and interval logged, its summary kept in ``last_eval_sets``."""
        self.last_eval_sets, self.last_eval_sets_step = [], trainer.global_step
        for name, prompts in self.eval_set_prompts.items():
            for mode in modes:
                records = decode_eval_set(
                    pl_module.target, pl_module.drafter, prompts, mode, self.max_new_tokens, self.k,
                    stop=lambda: stop_requested(trainer),
                )  # fmt: skip
                if records is None:
                    print(
                        "SpeculativeDecodingCallback: stopped on SIGTERM, the rest of the eval sets is skipped",
                        flush=True,
                    )
                    return
                if not records:
                    print(f"SpeculativeDecodingCallback: eval set {name} ({mode}): no prompt had a verify step")
                    continue
                summary = summarize_eval_set(name, records, mode=mode, max_new_tokens=self.max_new_tokens)
                for key, value in eval_set_metrics(summary).items():
                    pl_module.log(key, value, rank_zero_only=True)
                self.last_eval_sets.append(summary)

    def _decode(self, trainer, pl_module, prompts, mode) -> tuple[float, float | None] | None:
        """(measured tau, on-policy greedy tau or None) of ``mode`` over ``prompts``; None when a stop was requested
        (checked before each decode and each replay: a prompt's work is the unit, a few seconds at most)."""
        target, drafter = pl_module.target, pl_module.drafter
        emitted = forwards = on_policy = blocks = 0
        for prompt in prompts:
            if stop_requested(trainer):
                return None
            record = record_decode(target, drafter, prompt, self.max_new_tokens, mode, self.k, check_lossless=False)
            emitted += sum(a + 1 for a in record.accepted)
            forwards += len(record.accepted)
            if stop_requested(trainer):
                return None
            # the training metric on the target's own reply, a block at every reply position (teacher-forced)
            L = record.prompt_length
            replay = teacher_forced_blocks(
                target, drafter, record.text, list(range(L, len(record.output))), L, mode, self.k, "teacher"
            )
            on_policy += sum(a + 1 for a in replay.metric_accepted)
            blocks += len(replay.metric_accepted)
        return emitted / max(1, forwards), (on_policy / blocks if blocks else None)
