"""The verifier the export tests share: the tiny Qwen3 of ``helpers.export`` saved once per module, and loaded as the
frozen target a drafter is exported against (a test module may define its own ``target`` instead)."""

from __future__ import annotations

import pytest
from helpers.export import save_verifier

from dspark_lightning.models import FrozenTarget


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    return save_verifier(tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="module")
def target(verifier_dir):
    return FrozenTarget.from_pretrained(str(verifier_dir), num_draft_layers=2)
