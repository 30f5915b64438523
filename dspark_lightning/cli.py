"""The ``dspark-lightning`` command line (also ``python -m dspark_lightning``): one table of every command.

``fit``/``validate``/``test`` are LightningCLI subcommands (``lightning/fit.py``), every other command a typed function
whose signature and docstring become its options: docs/guides/train_and_evaluate.md, docs/design/design.md §10.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from jsonargparse import ActionConfigFile, ArgumentParser

from dspark_lightning.errors import UserError
from dspark_lightning.huge_pages import use_huge_pages
from dspark_lightning.interop.export import export_command
from dspark_lightning.interop.import_gguf import import_gguf_command
from dspark_lightning.interop.serve_check import serve_check_command
from dspark_lightning.interop.serve_speedup import serve_speedup_command
from dspark_lightning.lightning.fit import LIGHTNING_COMMANDS, lightning_main
from dspark_lightning.measuring.calibrate import calibrate_command
from dspark_lightning.measuring.decode import decode_command
from dspark_lightning.preparation.cache import cache_command
from dspark_lightning.preparation.draft_vocab import draft_vocab_command
from dspark_lightning.preparation.regenerate import regenerate_command
from dspark_lightning.studies.loss_study import loss_study_command
from dspark_lightning.studies.report import report_command
from dspark_lightning.studies.report_recipe import report_recipe_command

TOOL_COMMANDS: dict[str, Callable[..., object]] = {
    "import-gguf": import_gguf_command,
    "regenerate": regenerate_command,
    "cache": cache_command,
    "draft-vocab": draft_vocab_command,
    "decode": decode_command,
    "calibrate": calibrate_command,
    "export": export_command,
    "serve-check": serve_check_command,
    "serve-speedup": serve_speedup_command,
    "report": report_command,
    "report-recipe": report_recipe_command,
    "loss-study": loss_study_command,
}


def summary(function: Callable) -> str:
    """The first line of a command's docstring (its one-line help)."""
    return (function.__doc__ or "").strip().splitlines()[0]


def command_parser(name: str) -> ArgumentParser:
    """The parser of one tool command: the function's parameters as ``--options``, plus ``--config``."""
    function = TOOL_COMMANDS[name]
    parser = ArgumentParser(prog=f"dspark-lightning {name}", description=summary(function))
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of this command's options")
    parser.add_function_arguments(function, as_positional=False)
    return parser


DESCRIPTION = (  # what `dspark-lightning --help` opens with: for users, so no reST markup
    "Train, evaluate and export DSpark draft models for speculative decoding. "
    "`dspark-lightning COMMAND --help` lists a command's options; `python -m dspark_lightning` is the same program."
)


def build_parser() -> ArgumentParser:
    """The whole command table as one parser (``dspark-lightning --help``); fit/validate/test parse in LightningCLI."""
    parser = ArgumentParser(prog="dspark-lightning", description=DESCRIPTION)
    subcommands = parser.add_subcommands(required=True)
    for name, help_text in LIGHTNING_COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(description=help_text, add_help=False), help=help_text)
    for name, function in TOOL_COMMANDS.items():
        subcommands.add_subcommand(name, command_parser(name), help=summary(function))
    return parser


def suggestion(message: str, parser) -> str:
    """`` (did you mean --ckpt_path?)`` for each misspelt option or command in a parser's error message, from the
    parser's own option names and commands (difflib's close matches); "" when nothing is close."""
    unknown = re.search(r"unrecognized arguments: (.*)", message, re.I)
    choice = re.search(r"invalid choice: '([^']+)'", message)
    if unknown:
        words = [w.split("=", 1)[0] for w in unknown[1].split() if w.startswith("--")]
        names = list(parser._option_string_actions)
    elif choice:
        words, names = [choice[1]], [*LIGHTNING_COMMANDS, *TOOL_COMMANDS]
    else:
        return ""
    close = [match[0] for word in words if (match := difflib.get_close_matches(word, names, n=1, cutoff=0.6))]
    return f" (did you mean {' / '.join(close)}?)" if close else ""


@contextmanager
def short_usage_errors(prog: str) -> Iterator[None]:
    """While a command line parses, a usage error prints two lines: the error (with a "did you mean" for a misspelt
    option) and where the options are listed, instead of jsonargparse's whole usage (110 lines for ``fit``).

    jsonargparse has no hook for this and LightningCLI builds its own parsers, so ``ArgumentParser.error`` (which
    both inherit) is replaced for the duration; a parser that raises instead of exiting, and ``DSPARK_DEBUG=1`` or
    ``JSONARGPARSE_DEBUG``, keep the original behaviour.
    """
    original = ArgumentParser.error

    def error(parser, message: str, ex: Exception | None = None):
        debug = os.environ.get("DSPARK_DEBUG") == "1" or os.environ.get("JSONARGPARSE_DEBUG")
        if not parser.exit_on_error or debug:
            return original(parser, message, ex)
        failing = getattr(ex, "subcommand_parser", None) or parser
        usage = f"{prog} [options]" if " " in prog else f"{prog} COMMAND [options]"
        sys.stderr.write(f"usage: {usage}   ({prog} --help lists them)\n")
        sys.stderr.write(f"{prog}: error: {message}{suggestion(message, failing)}\n")
        parser.exit(2)

    ArgumentParser.error = error
    try:
        yield
    finally:
        ArgumentParser.error = original


def run_command(name: str, argv: Sequence[str]) -> object:
    """Parse ``argv`` as the options of tool command ``name`` and call its function; returns what it returns."""
    parser = command_parser(name)
    config = parser.instantiate(parser.parse_args(list(argv)))  # dataclass groups (report's budget) built
    values = vars(config)
    values.pop("config", None)
    return TOOL_COMMANDS[name](**values)


def cli_main(args: Sequence[str] | None = None, run: bool = True) -> object:
    """Entry point. ``args`` defaults to ``sys.argv[1:]``; returns the LightningCLI object or the tool's result.

    ``run=False`` (Python only) builds fit's model, data module and trainer without fitting (``args`` without the
    ``fit`` word).
    """
    argv = list(sys.argv[1:] if args is None else args)
    known = argv and argv[0] in (*TOOL_COMMANDS, *LIGHTNING_COMMANDS)
    with short_usage_errors(f"dspark-lightning {argv[0]}" if known else "dspark-lightning"):
        if argv and argv[0] in TOOL_COMMANDS:
            return run_command(argv[0], argv[1:])
        if run and not known:
            build_parser().parse_args(argv)  # --help lists every command; anything else is a usage error naming them
        epilog = f"other commands (dspark-lightning COMMAND --help): {', '.join(TOOL_COMMANDS)}"
        return lightning_main(None if args is None else argv, run=run, epilog=epilog)


def main() -> int:
    """Console-script entry point (``dspark-lightning``): exit status 0 on success, 2 on an error in what the user
    gave (printed as one line; ``DSPARK_DEBUG=1`` shows its traceback), a traceback for anything else."""
    # Lightning's own call of a torch API that newer torch deprecates: nothing a user of the command can act on
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    use_huge_pages()  # before any model loads: PyTorch reads the setting at its first large allocation
    try:
        cli_main()
    # a missing file, or one in the way of an output, is always one the user named
    except (UserError, FileNotFoundError, FileExistsError) as error:
        if os.environ.get("DSPARK_DEBUG") == "1":
            raise
        print(f"dspark-lightning: error: {error} (DSPARK_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
