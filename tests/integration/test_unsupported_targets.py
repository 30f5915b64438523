"""A target the decoding loop cannot serve (a tiny Mamba) is refused by ``fit`` and ``cache`` in one line, exit
status 2, before any weight is read or any step runs."""

from __future__ import annotations

import shutil

import pytest
from helpers.paths import DEMO_TARGET, ROOT
from helpers.quickstart import quickstart_fit_args

from dspark_lightning.cli import main

REFUSAL = (
    "dspark-lightning: error: target model type 'mamba' (MambaForCausalLM) is not supported: its forward takes no "
    "position_ids, which packed training and the verify forwards pass (DSPARK_DEBUG=1 shows the traceback)"
)


@pytest.fixture(scope="module")
def mamba_folder(tmp_path_factory):
    """A random Mamba config with the demo tokenizer, and weights that would fail to load if anything read them."""
    from transformers import MambaConfig

    folder = tmp_path_factory.mktemp("mamba")
    MambaConfig(vocab_size=2048, hidden_size=16, state_size=4, num_hidden_layers=2).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(DEMO_TARGET / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"not weights")
    return folder


def _one_line_refusal(argv, monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["dspark-lightning", *argv])
    assert main() == 2
    assert capsys.readouterr().err.strip().splitlines() == [REFUSAL]


def test_fit_refuses_a_mamba_target_in_one_line(mamba_folder, tmp_path, monkeypatch, capsys):
    args = [*quickstart_fit_args(), f"--model.target.path={mamba_folder}", f"--trainer.default_root_dir={tmp_path}"]
    _one_line_refusal([*args, "--trainer.max_steps=1", "--trainer.logger=false"], monkeypatch, capsys)
    assert not list(tmp_path.rglob("*.ckpt"))


def test_cache_refuses_a_mamba_target_in_one_line(mamba_folder, tmp_path, monkeypatch, capsys):
    data = str(ROOT / "assets/data/regenerated/train-00000.jsonl")
    args = ["cache", "--target", str(mamba_folder), "--data", data, "--output", str(tmp_path / "cache")]
    _one_line_refusal([*args, "--device", "cpu", "--limit", "2"], monkeypatch, capsys)
    assert not (tmp_path / "cache").exists()


def test_fsdp_refuses_a_target_that_runs_packed_documents_one_at_a_time(tmp_path):
    """Ranks would run different numbers of sharded target forwards (a hang): refused when the model is configured."""
    from types import SimpleNamespace

    from helpers.targets import make_tiny_qwen3_next
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from dspark_lightning.errors import UnsupportedError
    from dspark_lightning.lightning.config import TargetArgs
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.models import DrafterConfig

    make_tiny_qwen3_next().save_pretrained(tmp_path)
    module = DSparkModule(target=TargetArgs(path=str(tmp_path)), drafter=DrafterConfig(block_size=4, mask_token_id=63))
    module._trainer = SimpleNamespace(strategy=DDPStrategy())
    module.configure_model()  # DDP: every rank keeps the whole target, nothing to gather
    module._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(UnsupportedError, match=r"^--trainer.strategy fsdp cannot shard target model type 'qwen3_next'"):
        module.configure_model()
