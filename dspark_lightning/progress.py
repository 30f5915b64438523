"""What long commands share: a rich progress bar with an ETA, and stopping cleanly on SIGTERM.

At the package root, in the lowest layer (it imports nothing of the package), because its users sit in several
layers: ``regenerate`` and the feature cache (preparation/), the decode tables (measuring/); the training
callbacks (lightning/) read Lightning's own stop flag (``trainer.received_sigterm``) through ``stop_requested``."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic

LOG_EVERY_S = 60.0  # off a terminal: how often a progress line is written


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "") -> Iterator[Callable[..., None]]:
    """A rich progress bar (done/total, elapsed, ETA) on stderr while the block runs; yields ``advance(n=1)``.

    stderr, so what a command prints on stdout (regenerate's JSON summary, decode's tables) stays clean; ``total``
    None (a streamed source of unknown length) shows the count and the elapsed time without an ETA. Off a terminal
    (``nohup``, a batch job's log file, a test) rich draws the bar once, when the block ends, so a line
    ``<description>: done/total unit, elapsed, ETA`` is also written at most every ``LOG_EVERY_S`` seconds: a
    job's log shows how far it is while it runs. With :func:`stop_on_sigterm`::

        with progress_bar("regenerate", total=480, unit="records") as advance, stop_on_sigterm("regenerate") as stop:
            for batch in batches:
                if stop():
                    break  # a resumable command: the next run continues here
                ...
                advance(len(batch))
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    console = Console(stderr=True)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(description, total=total)
        if console.is_terminal:
            yield lambda n=1: progress.advance(task, n)
            return
        clock = LineClock()

        def advance(n: int = 1) -> None:
            progress.advance(task, n)
            if (elapsed := clock.due()) is not None:
                print(progress_line(description, progress.tasks[0].completed, total, unit, elapsed),
                      file=sys.stderr, flush=True)  # fmt: skip

        yield advance


class LineClock:
    """When an off-terminal progress line is due: ``due()`` is the seconds since the clock was made when the last
    line is at least ``LOG_EVERY_S`` old (that call counts as the line written), else None."""

    def __init__(self) -> None:
        self.started = self.last = monotonic()

    def due(self) -> float | None:
        now = monotonic()
        if now - self.last < LOG_EVERY_S:
            return None
        self.last = now
        return now - self.started


def progress_line(
    description: str, done: float, total: int | None, unit: str, elapsed: float, done_in_elapsed: float | None = None
) -> str:
    """``cache: 87/300 samples, 14:02 elapsed, ETA 34:20`` (no ETA without a total or before the first unit).
    ``done_in_elapsed``: the units done in ``elapsed`` when fewer than ``done`` (a resumed run), for the ETA."""
    line = f"{description}: {done:.0f}{'' if total is None else f'/{total}'} {unit}".rstrip()
    line += f", {_clock(elapsed)} elapsed"
    rate_done = done if done_in_elapsed is None else done_in_elapsed
    if total is not None and rate_done > 0:
        line += f", ETA {_clock(elapsed * max(total - done, 0) / rate_done)}"
    return line


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


@contextmanager
def stop_on_sigterm(command: str) -> Iterator[Callable[[], bool]]:
    """Turn SIGTERM into a stop request while the block runs; yields ``requested()`` for the command to check between
    units of work (a batch, a prompt), so it ends within one unit and leaves what it finished in a resumable state.

    The first SIGTERM only sets the flag (and says so on stderr); a second one exits at once (status 143). The
    previous handler comes back when the block ends. Off the main thread (where Python cannot install handlers) the
    flag is never set and SIGTERM keeps its usual effect.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handle(signum, frame) -> None:
        if received:
            raise SystemExit(128 + signum)  # asked twice: do not wait for the unit of work to finish
        received.append(signum)
        print(f"{command}: SIGTERM received, stopping after the current unit of work", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield lambda: bool(received)
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_requested(trainer) -> bool:
    """Whether Lightning has received SIGTERM (a callback's check between units of work; Lightning itself stops only
    at the next batch boundary, which a long epoch-end hook would otherwise delay by its whole run)."""
    return bool(getattr(trainer, "received_sigterm", False))
