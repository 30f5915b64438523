"""``--trainer.precision auto``: bf16-mixed on a CPU with AMX or AVX512-BF16, 32-true on one without, logged."""

from __future__ import annotations

import pytest
import torch

from dspark_lightning.cli import cli_main
from dspark_lightning.lightning import precision as precision_module
from dspark_lightning.lightning.precision import resolve_precision
from dspark_lightning.machine import machine_description

AMX = "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX512_BF16 = "model name\t: AMD EPYC 9654\nflags\t\t: avx2 avx512f avx512_bf16\n"
AVX2 = "model name\t: AMD EPYC 7B13\nflags\t\t: avx2 fma\n"


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(("cpuinfo", "expected"), [(AMX, "bf16-mixed"), (AVX512_BF16, "bf16-mixed"), (AVX2, "32-true")])
def test_auto_follows_the_cpu_flags(cpuinfo, expected):
    chosen, why = resolve_precision("auto", "cpu", machine_description(cpuinfo, lscpu=""))
    assert chosen == expected and machine_description(cpuinfo, lscpu="")["cpu"] in why


def test_an_explicit_precision_is_kept():
    assert resolve_precision("32-true", "cpu", machine_description(AMX, lscpu="")) == ("32-true", "given")


@pytest.mark.parametrize(("cpuinfo", "expected"), [(AMX, "bf16-mixed"), (AVX2, "32-true")])
def test_fit_builds_its_trainer_in_the_resolved_precision_and_logs_it(cpuinfo, expected, monkeypatch, caplog):
    monkeypatch.setattr(precision_module, "machine_description", lambda: machine_description(cpuinfo, lscpu=""))
    args = ["--config", "configs/quickstart.yaml", "--trainer.precision=auto", "--trainer.logger=false"]
    with caplog.at_level("INFO"):
        cli = cli_main([*args, "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false"], run=False)
    assert cli.trainer.precision == expected
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision auto")] == [
        f"precision auto: {expected} ({resolve_precision('auto', 'cpu', machine_description(cpuinfo, lscpu=''))[1]})"
    ]


def test_a_misspelt_precision_is_refused_naming_the_option():
    with pytest.raises(SystemExit):
        cli_main(["--config", "configs/quickstart.yaml", "--trainer.precision=autoo"], run=False)


def test_bf16_mixed_clips_the_gradients_of_a_fused_optimizer():
    """Lightning's bf16-mixed plugin refuses to clip for a fused AdamW (the configs' optimizer) although bf16 has no
    gradient scaler; ours clips: the global norm ends at clip_val, the direction kept."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from dspark_lightning.lightning.precision import BF16MixedPrecision, Trainer

    trainer = Trainer(precision="bf16-mixed", accelerator="cpu", logger=False, enable_checkpointing=False)
    plugin = trainer.strategy.precision_plugin
    assert isinstance(plugin, BF16MixedPrecision) and plugin.scaler is None
    weights = [torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64)), torch.nn.Parameter(torch.zeros(5))]
    grads = [torch.arange(12.0, dtype=torch.float64).reshape(3, 4), torch.full((5,), -2.0)]
    for weight, grad in zip(weights, grads, strict=True):
        weight.grad = grad.clone()
    optimizer = torch.optim.AdamW(weights, fused=True)
    with pytest.raises(RuntimeError, match="gradient clipping"):  # what the stock plugin does with it
        MixedPrecision("bf16-mixed", device="cpu").clip_gradients(optimizer, 1.0)
    plugin.clip_gradients(optimizer, 0.5)
    norm = sum(float((g.double() ** 2).sum()) for g in grads) ** 0.5  # 23.3: far above 0.5
    for weight, grad in zip(weights, grads, strict=True):
        torch.testing.assert_close(weight.grad.double(), grad.double() * 0.5 / norm, rtol=1e-5, atol=0)


def test_a_bf16_mixed_fit_with_fused_adamw_and_clipping_runs(tmp_path):
    """The SmolLM2 and Gemma 3 configs train with fused AdamW, gradient_clip_val 1.0 and precision auto: on a CPU with
    AMX that is bf16-mixed, and their first step must not stop."""
    args = ["--config", "configs/quickstart.yaml", "--trainer.precision=bf16-mixed", "--trainer.logger=false"]
    args += ["--model.optimizer.init_args.fused=true", "--trainer.max_steps=2", "--trainer.limit_val_batches=0"]
    cli = cli_main([*args, "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
                    f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"], run=False)  # fmt: skip
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2 and cli.trainer.precision == "bf16-mixed"
