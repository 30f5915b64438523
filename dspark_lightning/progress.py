"""What long commands share: a rich progress bar with an ETA, and stopping cleanly on SIGTERM.

At the package root, in the lowest layer (it imports nothing of the package), because the commands that use it sit
in three layers: ``regenerate`` (data/), the decode tables (evaluation/) and the feature cache (preparation/); the
training callbacks read Lightning's own stop flag (``trainer.received_sigterm``) through ``stop_requested``.

    with progress_bar("regenerate", total=480, unit="records") as advance, stop_on_sigterm("regenerate") as stop:
        for batch in batches:
            if stop():
                break  # a resumable command: the next run continues here
            ...
            advance(len(batch))
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "") -> Iterator[Callable[..., None]]:
    """A rich progress bar (done/total, elapsed, ETA) on stderr while the block runs; yields ``advance(n=1)``.

    stderr, so what a command prints on stdout (regenerate's JSON summary, decode's tables) stays clean; ``total``
    None (a streamed source of unknown length) shows the count and the elapsed time without an ETA. Off a terminal
    (a log file, a test) rich draws the bar once, when the block ends.
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
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


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
