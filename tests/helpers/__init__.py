"""Helpers shared by test modules (``tests/`` is on ``sys.path``: ``pythonpath`` in pyproject.toml); test modules
never import each other."""
