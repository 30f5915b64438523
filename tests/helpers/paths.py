"""Repository paths for tests, independent of where a test module sits under ``tests/``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
DEMO_TARGET = ASSETS / "demo-target"
