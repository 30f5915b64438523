"""Commands as the lines that make them: a ``fit`` call to paste into a shell, a tool call as a report records it."""

from __future__ import annotations

import json
from collections.abc import Sequence


def shell_command(args: Sequence[str]) -> str:
    """``args`` as a copy-pasteable ``dspark-lightning`` command line, one option per line."""
    import shlex

    words = [shlex.quote(a) for a in args]
    head = ["dspark-lightning " + words.pop(0)] if words and not args[0].startswith("-") else ["dspark-lightning"]
    return " \\\n    ".join(head + words)


def command_line(name: str, function, values: dict) -> str:
    """The one-line ``dspark-lightning NAME ...`` that calls ``function`` with ``values`` (defaults left out).

    What a report records as the command that made it; values are spelled as the command table parses them (YAML
    lists ``[a,b]``, ``true``/``false``, a dataclass as ``--name.field value``).
    """
    import dataclasses
    import inspect
    import re
    import shlex

    def spelled(value) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (list, tuple)):
            items = [spelled(v) for v in value]
            if all(re.fullmatch(r"[^\[\]{},:\s\"']+", item) for item in items):
                return "[" + ",".join(items) + "]"
            return json.dumps(list(value))  # an item YAML would split or nest (brackets, commas, colons)
        return str(value)

    words = [f"dspark-lightning {name}"]
    for key, parameter in inspect.signature(function).parameters.items():
        value, default = values[key], parameter.default
        if dataclasses.is_dataclass(value):
            defaults = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else {}
            words += [
                f"--{key}.{field} {shlex.quote(spelled(v))}"
                for field, v in dataclasses.asdict(value).items()
                if defaults.get(field) != v
            ]
        elif value is not None and (parameter.default is inspect.Parameter.empty or value != default):
            words.append(f"--{key} {shlex.quote(spelled(value))}")
    return " ".join(words)
