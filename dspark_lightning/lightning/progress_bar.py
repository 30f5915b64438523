"""A rich progress bar that counts what ends a run: optimizer steps of ``trainer.max_steps`` (``StepProgressBar``)."""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import RichProgressBar

from dspark_lightning import progress


class StepProgressBar(RichProgressBar):
    """``RichProgressBar`` over optimizer steps of ``trainer.max_steps``; what the shipped configs use.

    The data stream has no fixed length, so runs are bounded by ``max_steps`` and Lightning sets ``max_epochs`` to -1:
    its ``RichProgressBar`` then shows ``Epoch 3/-2``, restarts its count at every pass over the data and gives no ETA.
    This bar keeps one bar for the whole run, ``global_step / max_steps`` with elapsed time and ETA, names the pass as
    ``epoch N`` without a bogus bound, and leaves out ``v_num`` (the logger's version, shown by Lightning as a metric:
    ``v_num: 0.000``; the run directory already says it). Without a ``max_steps`` it behaves like ``RichProgressBar``.
    Off a terminal (``nohup``, a batch job's log) rich draws nothing until the run ends, so a line
    ``fit: 300/1200 steps, 5:02 elapsed, ETA 15:06 | <metrics>`` is written at most every ``progress.LOG_EVERY_S``
    seconds instead.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # the off-terminal line: its clock starts at the first step this process trains (a resumed run's own start)
        self._line_clock: progress.LineClock | None = None
        self._line_first_step = 0

    def _max_steps(self) -> int | None:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps is not None and max_steps > 0 else None

    @property
    def total_train_batches(self) -> int | float:
        return self._max_steps() or super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        if self._max_steps() is None:
            return super()._get_train_description(current_epoch)
        max_epochs = self.trainer.max_epochs
        bound = f"/{max_epochs - 1}" if max_epochs is not None and max_epochs > 0 else ""
        return f"steps, epoch {current_epoch}{bound}"

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self._max_steps() is None:
            return super().on_train_epoch_start(trainer, pl_module)
        if self.is_disabled or self.progress is None:
            return
        description = self._get_train_description(trainer.current_epoch)
        themed = f"[{self.theme.description}]{description}" if self.theme.description else description
        if self.train_progress_bar_id is None:  # one bar for the whole run, not one per pass over the data
            # starting at global_step (a resumed run), so the ETA's speed never sees a jump from 0
            total = self._max_steps()
            self.train_progress_bar_id = self.progress.add_task(themed, total=total, completed=trainer.global_step)
        else:
            self.progress.update(self.train_progress_bar_id, description=themed)
        self.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._max_steps() is None:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()  # resumed mid-epoch
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()
        if not self.is_disabled and self._console is not None and not self._console.is_terminal:
            self._log_line(trainer, pl_module)

    def _log_line(self, trainer, pl_module) -> None:
        if self._line_clock is None:
            self._line_clock, self._line_first_step = progress.LineClock(), trainer.global_step
            return
        if (elapsed := self._line_clock.due()) is None:
            return
        step, this_run = trainer.global_step, trainer.global_step - self._line_first_step
        line = progress.progress_line("fit", step, self._max_steps(), "steps", elapsed, this_run)
        metrics = self.get_metrics(trainer, pl_module)
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        print(f"{line} | {shown}" if shown else line, file=sys.stderr, flush=True)

    def get_metrics(self, trainer, pl_module):
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
