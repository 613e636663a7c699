"""FUNNEL_DEVICE=auto: put this worker on the device with the fewest live workers.

Several replicas started on a host with several GPUs (`docker compose up
--scale worker-text=4` with every GPU visible to every container) spread
themselves out: each counts the live workers per device in the registry
(`funnel:workers`, and the `device` field of every `funnel:worker:{<model>}:<id>`
hash whose TTL has not run out) and takes the least used candidate, the first one
on a tie. Workers of every model count, since they share the GPU's memory and
time.

Two replicas starting at the same moment would both see the same counts
before either registers (registration waits for the model to load), so the
choice is made and recorded in one Lua script (common/link/lua/choose_device.lua):
besides the live workers read just before (worker hashes live in their
models' slots, which one script may not span on Redis Cluster), it counts
*claims*, a sorted set `funnel:device-claims` of "<device> <worker id>"
scored by their expiry time, and adds this worker's claim before it returns. A claim lasts
CLAIM_TTL_S, long enough to cover loading the model and the first heartbeat;
a worker that has both a live claim and a live heartbeat is counted once.
"""

from __future__ import annotations

import ctypes
import logging
import re
import uuid

import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.common.link import lua_scripts

log = logging.getLogger(__name__)

CLAIM_TTL_S = 120.0
DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")

def check_device(device: str) -> str:
    if not DEVICE_PATTERN.match(device):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda:N")
    return device


def choose(client: redis.Redis, keys: Keys, candidates: list[str], worker_id: str | None = None,
           claim_ttl_s: float = CLAIM_TTL_S) -> str:
    """The candidate with the fewest live workers (and fresh claims), claimed for worker_id."""
    if not candidates:
        raise ValueError("no candidate devices")
    for device in candidates:
        check_device(device)
    candidates = list(dict.fromkeys(candidates))  # a device listed twice is one device
    worker_id = worker_id or f"claim-{uuid.uuid4().hex[:12]}"
    live = [value for pair in live_devices(client, keys).items() for value in pair]
    result = client.eval(lua_scripts.source("choose_device"), 1, keys.device_claims(), worker_id,
                         int(claim_ttl_s * 1000), len(candidates), *candidates, *live)
    chosen = result[0].decode() if isinstance(result[0], bytes) else result[0]
    log.info("device %s chosen from %s", chosen,
             ", ".join(f"{d} ({n} workers)" for d, n in zip(candidates, result[1:])))
    return chosen


def live_counts(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Live workers per device, as the registry shows them (for tools and tests)."""
    counts: dict[str, int] = {}
    for device in live_devices(client, keys).values():
        counts[device] = counts.get(device, 0) + 1
    return counts


def live_devices(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """Each live worker's device, by id: a worker serving several models once (each of its models'
    hashes names it, `process`)."""
    return {worker.get("process", worker["id"]): worker["device"]
            for worker in registry.live_workers(client, keys) if "device" in worker}


def cuda_device_count() -> int:
    """GPUs the CUDA driver shows this process (CUDA_VISIBLE_DEVICES applies); 0 without a driver.

    Asks libcuda directly, so an onnxruntime worker need not import torch to count.
    """
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return _torch_device_count()
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _torch_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_devices(backend: str) -> list[str]:
    """The CUDA devices this backend can run on here: ["cuda:0", ...], or [] for none."""
    if backend == "torch":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return []
        count = cuda_device_count()
    return [f"cuda:{i}" for i in range(count)]


def resolve(requested: str, candidates: list[str], backend: str, client: redis.Redis, keys: Keys,
            worker_id: str) -> str:
    """A concrete device for --device: itself unless "auto", else the least used candidate.

    Candidates are --devices when given, else every CUDA device the backend
    sees, else the CPU. With one candidate Redis is not asked.
    """
    if requested != "auto":
        return check_device(requested)
    found = list(dict.fromkeys(candidates)) or cuda_devices(backend)
    if not found:
        log.warning("device auto: the %s backend sees no CUDA device; running on the CPU", backend)
        return "cpu"
    if len(found) == 1:
        return check_device(found[0])
    return choose(client, keys, found, worker_id)
