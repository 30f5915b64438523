"""The machine a figure was measured on: CPU model, the instruction-set flags that decide bf16 speed, cores, torch.

Every results file (benchmarks, ``decode --json``, the reports) carries ``machine_description()``, so a number is never
read without its machine; ``fast_bf16()`` answers whether bf16 matmuls have a hardware path here (AMX or
AVX512-BF16), which ``fit``'s ``precision: auto`` uses. In the bottom layer: it imports nothing of the package.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

import torch

# the flags that decide how fast fp32 and bf16 matmuls run on a CPU (as /proc/cpuinfo spells them)
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# either gives oneDNN a bf16 dot-product instruction; without either, bf16 matmuls convert to fp32 and back
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")


def _lscpu() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _field(text: str, names: Iterable[str]) -> str | None:
    """The value of the first ``name: value`` line whose name is one of ``names`` (case-insensitive)."""
    wanted = {name.lower() for name in names}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in wanted:
            return value.strip()
    return None


def cpu_info(cpuinfo: str | None = None, lscpu: str | None = None) -> tuple[str, set[str]]:
    """(CPU model name, its flags) from ``/proc/cpuinfo``, else ``lscpu``; ("unknown", set()) where neither says.

    ``cpuinfo`` and ``lscpu`` are those files' texts (tests pass their own); None reads this machine's."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            cpuinfo = ""
    model, flags = _field(cpuinfo, ["model name"]), _field(cpuinfo, ["flags", "features"])
    if model is None or flags is None:
        lscpu = _lscpu() if lscpu is None else lscpu
        model = model or _field(lscpu, ["model name"])
        flags = flags if flags is not None else _field(lscpu, ["flags"])
    return model or platform.processor() or "unknown", set((flags or "").split())


def mkldnn_bf16() -> bool:
    """Whether torch's oneDNN reports bf16 support on this CPU (False where the query is missing)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def machine_description(cpuinfo: str | None = None, lscpu: str | None = None) -> dict[str, object]:
    """This machine as a flat JSON-ready dict: ``cpu``, ``flags`` (those of ``FLAGS`` present, space-separated),
    one bool per flag in ``FLAGS``, ``cores``, ``threads`` (torch's), ``torch``, ``cpu_capability`` (the kernels
    ATen dispatches to), ``mkldnn_bf16``, ``fast_bf16``, the ``load_average`` at the call and ``huge_pages`` (whether
    the process asked PyTorch for 2 MB pages, ``THP_MEM_ALLOC_ENABLE=1``)."""
    model, flags = cpu_info(cpuinfo, lscpu)
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        load = "unknown"
    return {
        "cpu": model,
        "flags": " ".join(flag for flag in FLAGS if flag in flags) or "none",
        **{flag: flag in flags for flag in FLAGS},
        "cores": str(os.cpu_count()),
        "threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": mkldnn_bf16(),
        "fast_bf16": any(flag in flags for flag in FAST_BF16_FLAGS),
        "load_average": load,
        # PyTorch's 2 MB pages for large CPU tensors, as asked for (huge_pages.py): they change step timings
        "huge_pages": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
    }


def fast_bf16(machine: dict | None = None) -> bool:
    """Whether this CPU (or the described one) has a bf16 matmul instruction: AMX-BF16 or AVX512-BF16."""
    machine = machine_description() if machine is None else machine
    return any(bool(machine.get(flag)) for flag in FAST_BF16_FLAGS)


def machine_line(machine: dict) -> str:
    """One markdown sentence naming the machine, for a results file's header."""
    return (
        f"Machine: {machine['cpu']} (flags: {machine['flags']}; oneDNN bf16 "
        f"{'yes' if machine.get('mkldnn_bf16') else 'no'}; ATen {machine.get('cpu_capability', '?')}), "
        f"{machine['cores']} cores visible, {machine['threads']} torch thread(s), torch {machine['torch']}."
    )
