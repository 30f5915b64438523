"""Experiments as entry points on top of the library: the demo report, the recipe report and the loss study.

Nothing in the library imports this package; only ``cli.py`` does, to register the commands. The tutorials and the
analysis notebook use its helpers (``runs``, ``command_lines``, ``quiet_output``) too.
"""
