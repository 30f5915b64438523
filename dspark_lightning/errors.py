"""Errors in what the user gave: a file, an option or a record. At the root because every layer raises them.

The command line prints such an error as one line naming the file, option or record and exits with status 2;
``DSPARK_DEBUG=1`` shows the traceback. Anything else is a crash and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Base of the errors a user fixes by changing a file, an option or a record (never a bug in this package)."""


class OptionError(UserError, ValueError):
    """An option's value cannot be used (its message names ``--the.option`` and what was expected)."""


class UnsupportedError(UserError, ValueError):
    """What was asked for is well formed but cannot be done: its message names what stands in the way."""
