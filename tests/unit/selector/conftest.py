"""Fixtures of the Selector tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    # The walk is many tiny ops; on a shared 2-core machine OpenMP barriers dominate them. One thread keeps it fast
    # (restored afterwards, whatever a test module set before).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
