"""The command line turns PyTorch's huge-page allocation on unless the user chose, and results files record it."""

from __future__ import annotations

import os

import pytest

from dspark_lightning import cli, huge_pages
from dspark_lightning.huge_pages import ENV, huge_pages_on, use_huge_pages
from dspark_lightning.machine import machine_description


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A stand-in for /sys/kernel/mm/transparent_hugepage/enabled; returns a setter of its text."""
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "SYSTEM_SETTING", path)
    return path.write_text


def test_turned_on_when_unset(monkeypatch, kernel):
    monkeypatch.delenv(ENV, raising=False)
    assert use_huge_pages() is True
    assert os.environ[ENV] == "1"
    assert machine_description()["huge_pages"] is True


def test_a_users_zero_keeps_it_off(monkeypatch, kernel):
    monkeypatch.setenv(ENV, "0")
    assert use_huge_pages() is False
    assert os.environ[ENV] == "0"
    assert machine_description()["huge_pages"] is False


def test_off_where_the_kernel_never_gives_huge_pages(monkeypatch, kernel):
    monkeypatch.setenv(ENV, "1")
    kernel("always madvise [never]\n")
    assert huge_pages_on() is False
    kernel("[always] madvise never\n")
    assert huge_pages_on() is True


def test_the_command_line_sets_it_before_the_command_runs(monkeypatch, kernel):
    monkeypatch.delenv(ENV, raising=False)
    seen = []
    monkeypatch.setattr(cli, "cli_main", lambda: seen.append(os.environ.get(ENV)))
    assert cli.main() == 0
    assert seen == ["1"]
