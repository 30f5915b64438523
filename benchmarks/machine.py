"""The machine a benchmark ran on (CPU model, cores, torch version and threads, load average), for its result files."""

from __future__ import annotations

import os
import platform
import subprocess

import torch


def machine_description() -> dict[str, str]:
    model = platform.processor() or "unknown"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return {
        "cpu": model,
        "cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
