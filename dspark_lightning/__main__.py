"""``python -m dspark_lightning`` == ``dspark-lightning``."""

import sys

from dspark_lightning.cli import main

sys.exit(main())
