"""machine.py: the CPU model and the flags that matter, read from /proc/cpuinfo (else lscpu), and fast_bf16."""

from __future__ import annotations

import json

import torch

from dspark_lightning.machine import FLAGS, cpu_info, fast_bf16, machine_description, machine_line

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"
LSCPU = "Architecture: x86_64\nModel name:   Intel(R) Xeon(R) Gold\nFlags:        avx2 avx512f avx512_bf16\n"


def test_flags_and_model_come_from_cpuinfo():
    model, flags = cpu_info(XEON, lscpu="")
    assert model.startswith("Intel(R) Xeon(R) Platinum 8481C") and {"amx_bf16", "avx512_bf16", "avx2"} <= flags
    machine = machine_description(XEON, lscpu="")
    assert machine["flags"] == "avx2 avx512f avx512_bf16 amx_bf16 amx_tile" and machine["amx_tile"] is True
    assert fast_bf16(machine) and machine["fast_bf16"] is True


def test_an_avx2_cpu_has_no_fast_bf16():
    machine = machine_description(EPYC, lscpu="")
    assert machine["cpu"] == "AMD EPYC 7B13" and machine["flags"] == "avx2"
    assert not fast_bf16(machine) and not machine["fast_bf16"] and not machine["avx512f"]


def test_lscpu_fills_in_where_cpuinfo_says_nothing():
    model, flags = cpu_info("", lscpu=LSCPU)
    assert model == "Intel(R) Xeon(R) Gold" and "avx512_bf16" in flags
    assert machine_description("", lscpu="")["flags"] == "none"  # neither file: no flags claimed


def test_this_machine_is_described_as_json_with_torch_and_threads():
    machine = json.loads(json.dumps(machine_description()))
    assert set(FLAGS) <= set(machine) and machine["torch"] == torch.__version__
    assert machine["threads"] == str(torch.get_num_threads()) and isinstance(machine["mkldnn_bf16"], bool)
    line = machine_line(machine)
    assert machine["cpu"] in line and f"torch {torch.__version__}" in line and machine["flags"] in line
