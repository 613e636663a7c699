"""The machine a benchmark ran on, for the results file: CPU, packages, GPU, load."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import subprocess
import sys
from pathlib import Path


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        return re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1)
    except (OSError, AttributeError):
        return "unknown CPU"


def machine() -> dict:
    cpu = cpu_model()
    wrk = subprocess.run(["wrk", "-v"], check=False, capture_output=True, text=True)
    wrk_version = wrk.stdout.split("\n")[0]
    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "wrk": " ".join(wrk_version.split()[:2]),
        "packages": {d: version(d) for d in (
            "onnxruntime", "torch", "transformers", "numpy", "pillow-simd", "flask", "gunicorn",
            "gevent", "service_streamer", "litserve", "fastapi", "uvicorn", "redis")},
    }


def gpu_name(device: str) -> str:
    """torch's name for the GPU, asked in a child process so that the driver does not import torch."""
    code = "import sys, torch; print(torch.cuda.get_device_name(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, device], check=False, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"--device {device}: torch cannot use it: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
