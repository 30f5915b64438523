"""The package outside its checkout: the wheel is built, installed into a fresh virtual environment and run from an
empty directory (the quickstart for a few steps, ``decode``, ``export``, ``--config quickstart``).

The fresh venv holds only the wheel; its third-party dependencies are this environment's (one ``.pth`` line adding
its site-packages, whose ``.pth`` files, the editable install among them, are not processed), so the checkout is
never importable there. ``make wheel-check`` installs the wheel with all its dependencies from the registry instead,
through the constraints file (minutes, and a network; not part of ``make test``)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers.paths import ROOT

SMALL = [
    "--trainer.max_steps=3",
    "--trainer.val_check_interval=3",
    "--trainer.limit_val_batches=1",
    "--data.limit_val_samples=8",
]


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(python of a fresh venv with only the wheel installed, the wheel's path)."""
    base = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", base / "dist", ROOT],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "dist").glob("dspark_lightning-*.whl")
    subprocess.run([sys._base_executable, "-m", "venv", base / "venv"], check=True, timeout=300)
    python = base / "venv/bin/python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(site) / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    return python, wheel


def run(python: Path, cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = os.environ | {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    return subprocess.run([python, "-m", "dspark_lightning", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_wheel_ships_the_configs_and_the_demo_assets(wheel_env):
    names = set(zipfile.ZipFile(wheel_env[1]).namelist())
    for needed in ("configs/quickstart.yaml", "configs/heads/gated.yaml", "configs/recipes/smollm2.yaml",
                   "assets/demo-target/config.json", "assets/data/sharegpt/validation-"):  # fmt: skip
        assert any(name.startswith(f"dspark_lightning/shipped/{needed}") for name in names), needed


def test_the_installed_package_is_not_the_checkout(wheel_env, tmp_path):
    where = subprocess.run([wheel_env[0], "-c", "import dspark_lightning; print(dspark_lightning.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert str(ROOT) not in where and "site-packages" in where


def test_quickstart_decode_and_export_from_an_empty_directory(wheel_env, tmp_path):
    python = wheel_env[0]
    fitted = run(python, tmp_path, "fit", "--config", "configs/quickstart.yaml", *SMALL)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/quickstart/version_0/checkpoints/last.ckpt")
    decoded = run(python, tmp_path, "decode", "--ckpt_path", str(ckpt.relative_to(tmp_path)), "--num_prompts", "2",
                  "--max_new_tokens", "8", "--modes", "[markov]", "--baseline", "false", "--json", "decode.json")  # fmt: skip
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    assert (tmp_path / "decode.json").is_file()
    exported = run(python, tmp_path, "export", "--ckpt_path", str(ckpt), "--output", "exported")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "exported/config.json").is_file() and list((tmp_path / "exported").glob("*.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode.json", "exported", "runs"]


def test_a_bare_config_name_is_the_shipped_config(wheel_env, tmp_path):
    """``--config quickstart`` and a shipped head config by name parse from an empty directory; a name that is
    neither a file nor a shipped config fails in one line naming it."""
    python = wheel_env[0]
    parsed = run(python, tmp_path, "fit", "--config", "quickstart", "--config", "heads/gated", "--print_config")
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert "kind: gated" in parsed.stdout
    missing = run(python, tmp_path, "fit", "--config", "no_such_config")
    assert missing.returncode != 0 and "no_such_config" in missing.stderr
    assert "Traceback" not in missing.stderr
