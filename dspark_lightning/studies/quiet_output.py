"""Console output kept to the results in reports and notebooks: Lightning info logs, HF progress bars and known
harmless warnings off (the training itself is unaffected)."""

from __future__ import annotations

import contextlib
import logging

KNOWN_HARMLESS_WARNINGS = (  # regular expressions matched at the start of the message
    r"LightningCLI's args parameter is intended",  # cli_main(args=...) inside Jupyter, whose argv holds kernel flags
    r"Found keys that are in the model state dict but not in the checkpoint",  # the frozen target is not saved
    r'install "ipywidgets" for Jupyter support',  # rich progress bar without ipywidgets
    r"IProgress not found",  # tqdm without ipywidgets
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs newer torch
)


QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning", "dspark_lightning")


def quiet_logs() -> None:
    """Keep console output to the results: Lightning info logs, HF progress bars and known harmless warnings off
    (used by the report and the notebooks; the training itself is unaffected).

    It also imports ``dspark_lightning.plotting``, which selects matplotlib's Agg backend on import: a notebook runs
    ``%matplotlib inline`` *after* this call, so a later first import of the plotting module cannot switch inline
    figures off.
    """
    import warnings

    import lightning.pytorch  # noqa: F401  (sets its own log level on import: import first, then lower it)
    from transformers.utils import logging as hf_logging

    from dspark_lightning import plotting  # noqa: F401  (deferred: matplotlib, only for figures; selects Agg)

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    for message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


@contextlib.contextmanager
def quieted():
    """``quiet_logs`` for the duration of a block (the report inside a longer-lived process, e.g. the tests)."""
    import warnings

    import lightning.pytorch  # noqa: F401  (import first: it sets its own log level on import)
    from transformers.utils import logging as hf_logging

    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        with warnings.catch_warnings():
            quiet_logs()
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
