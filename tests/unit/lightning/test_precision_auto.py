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
