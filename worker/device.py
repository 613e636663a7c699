"""FUNNEL_DEVICE=auto: put this worker on the device with the fewest live workers.

Several replicas started on a host with several GPUs (`docker compose up
--scale worker-text=4` with every GPU visible to every container) spread
themselves out: each counts the live workers per device in the registry
(`funnel:workers`, and the `device` field of every `funnel:worker:<id>` hash
whose TTL has not run out) and takes the least used candidate, the first one
on a tie. Workers of every model count, since they share the GPU's memory and
time.

Two replicas starting at the same moment would both see the same counts
before either registers (registration waits for the model to load), so the
choice is made and recorded in one Lua script: it also counts *claims*, a
sorted set `funnel:device-claims` of "<device> <worker id>" scored by their
expiry time, and adds this worker's claim before it returns. A claim lasts
CLAIM_TTL_S, long enough to cover loading the model and the first heartbeat;
a worker that has both a live claim and a live heartbeat is counted once.
"""

from __future__ import annotations

import ctypes
import logging
import re
import uuid

import redis

from funnel.common import registry
from funnel.common.keys import Keys

log = logging.getLogger(__name__)

CLAIM_TTL_S = 120.0
DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")

# KEYS[1] registry hash (worker id -> model), KEYS[2] claims sorted set.
# ARGV[1] worker hash prefix ("funnel:worker:"), ARGV[2] this worker's id,
# ARGV[3] claim ttl in ms, ARGV[4..] candidate devices in order of preference.
# Returns {chosen device, count of each candidate before this claim...}.
# The worker hashes are read by name, not declared in KEYS: fine on a single
# Redis (what Funnel uses), not on Redis Cluster.
CHOOSE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local me = ARGV[2]
local counts, seen = {}, {}
for i = 4, #ARGV do counts[ARGV[i]] = 0 end
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local sp = string.find(member, ' ', 1, true)
  if sp then
    local device, id = string.sub(member, 1, sp - 1), string.sub(member, sp + 1)
    if id == me then
      redis.call('ZREM', KEYS[2], member)  -- this worker's earlier claim: replaced below
    elseif not seen[id] then
      seen[id] = true
      if counts[device] then counts[device] = counts[device] + 1 end
    end
  end
end
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  if id ~= me and not seen[id] then
    local device = redis.call('HGET', ARGV[1] .. id, 'device')
    if device and counts[device] then counts[device] = counts[device] + 1 end
  end
end
local best = ARGV[4]
for i = 5, #ARGV do
  if counts[ARGV[i]] < counts[best] then best = ARGV[i] end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), best .. ' ' .. me)
local result = {best}
for i = 4, #ARGV do result[#result + 1] = counts[ARGV[i]] end
return result
"""


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
    result = client.eval(CHOOSE_LUA, 2, keys.workers(), keys.device_claims(), keys.worker_prefix(), worker_id,
                         int(claim_ttl_s * 1000), *candidates)
    chosen = result[0].decode() if isinstance(result[0], bytes) else result[0]
    log.info("device %s chosen from %s", chosen,
             ", ".join(f"{d} ({n} workers)" for d, n in zip(candidates, result[1:])))
    return chosen


def live_counts(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Live workers per device, as the registry shows them (for tools and tests)."""
    counts: dict[str, int] = {}
    for worker in registry.live_workers(client, keys):
        counts[worker["device"]] = counts.get(worker["device"], 0) + 1
    return counts


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
