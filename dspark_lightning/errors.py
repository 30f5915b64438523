"""Errors in what the user gave: a file, an option or a record. At the root because every layer raises them.

The command line prints such an error as one line naming the file, option or record and exits with status 2;
``DSPARK_DEBUG=1`` shows the traceback. Anything else is a crash and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class UserError(Exception):
    """Base of the errors a user fixes by changing a file, an option or a record (never a bug in this package)."""


class OptionError(UserError, ValueError):
    """An option's value cannot be used (its message names ``--the.option`` and what was expected)."""


class UnsupportedError(UserError, ValueError):
    """What was asked for is well formed but cannot be done: its message names what stands in the way."""


class MissingPackageError(UserError, ModuleNotFoundError):
    """A Python package the user named (``pkg:NAME``) or a command needs is not installed: the message says what to
    install."""


class LoadError(UserError, OSError):
    """A model, tokenizer or dataset that cannot be loaded from the path or hub id given: offline without a cached
    copy, a misspelt id, a gated repository without a token, or a local folder missing its files."""


@contextlib.contextmanager
def loading(option: str, name: str) -> Iterator[None]:
    """Turn the ``OSError`` (unreachable, missing files) or ``ValueError`` (a folder that is no model: "Unrecognized
    model") of a Hugging Face load of ``name``, given as ``option``, into a one-line ``LoadError`` naming both, with
    the library's own first line: its traceback ran to 40 lines of hub internals."""
    try:
        yield
    except (OSError, ValueError) as error:
        if isinstance(error, UserError):
            raise
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        exists = os.path.exists(os.path.expanduser(str(name)))
        if not exists and str(name).startswith((".", "/", "~")):  # a path, never a hub id: the hub's reason misleads
            raise LoadError(f"{option} {str(name)!r} does not exist") from error
        # "targets/smollm2" reads as a hub id too: say both, so a folder not made yet is not taken for a network fault
        hint = (
            "" if exists else " (no such local folder; as a hub id it needs the network or a Hugging Face cache copy)"
        )
        raise LoadError(f"{option} {str(name)!r} cannot be loaded: {first.rstrip('.')}{hint}") from error
