"""``python -m dspark_lightning`` == ``dspark-lightning``."""

from dspark_lightning.cli import cli_main

cli_main()
