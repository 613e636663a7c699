"""A model run in Python: the task's `load` and `predict`, in a process of the model's own.

A task that defines `load(device)` and `predict(model, batch)` (common/tasks/base.py)
is served without a graph file: your transformers, scikit-learn or numpy code
as it is. The worker starts one child process per such model version, which
imports the task, calls `load` once, then answers batches: the collated feeds
go down a socket and each item's row comes back, msgpack with numpy arrays
both ways (no pickle). The process is the model's own so that user code
cannot take the worker with it:

- a `predict` that raises fails its own call; the worker runs parts of the
  batch again to find the items at fault (worker/batch.py);
- a `predict` that outlasts the task's `predict_timeout_s` is ended: the
  process is killed, the call's items fail 504 (`predict_timeout`), and the
  next batch starts a fresh process (the model loaded again);
- a process that dies (a crash in native code, memory run out) fails its call
  500, and the next batch starts a fresh one;
- evicting the model (worker/residency.py) ends the process, so its memory,
  the device's included, goes back to the system: the worker logs what the
  process held, read from /proc, and waits for its exit.

The process dies with the worker: it reads end of file on its socket when idle,
and a thread of its own ends it within half a second of the worker's death
whatever it is doing.

    python -m funnel.worker.model_process FD   # started by the worker, FD its end of the socket
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from funnel.common.errors import FunnelError
from funnel.common.store import ModelSpec
from funnel.worker import allocator

log = logging.getLogger(__name__)

NDARRAY = 1  # msgpack extension code: an ndarray as [dtype, shape, bytes]
HEADER = struct.Struct(">I")  # each message: its length, then msgpack
LOAD_TIMEOUT_S = 600.0  # a load's longest wait (the worker's own FUNNEL_LOAD_TIMEOUT_S gives up sooner)
WATCH_S = 0.5  # how often the model's process looks for its worker


class Abandoned(FunnelError):
    """A call the process could not finish (it timed out or died): its items fail with this, and are not
    run again in parts, as each part could cost as much."""

    status, code = 500, "inference_failed"


# -- the messages ------------------------------------------------------------------------------

def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if hasattr(obj, "__array__"):  # an ndarray, or what converts to one (a CPU torch tensor)
        array = np.ascontiguousarray(np.asarray(obj))
        if array.dtype.hasobject:
            raise TypeError(f"an array of Python objects cannot leave the model's process: {type(obj).__name__}")
        return msgpack.ExtType(NDARRAY, msgpack.packb([array.dtype.str, list(array.shape), array.tobytes()]))
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} cannot leave the model's process: return numpy arrays, "
                    f"numbers, strings, lists and dicts")


def _ext(code: int, data: bytes) -> Any:
    if code != NDARRAY:
        return msgpack.ExtType(code, data)
    dtype, shape, raw = msgpack.unpackb(data)
    return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)


def send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    data = msgpack.packb(message, default=_default, use_bin_type=True)
    sock.sendall(HEADER.pack(len(data)) + data)


def receive(sock: socket.socket) -> dict[str, Any]:
    """The next message; EOFError once the other end has closed."""
    (size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return msgpack.unpackb(_exactly(sock, size), ext_hook=_ext, raw=False, strict_map_key=False)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def spec_message(spec: ModelSpec) -> dict[str, Any]:
    return {"name": spec.name, "task": spec.task, "path": str(spec.path), "batch_size": spec.batch_size,
            "config": spec.config, "version": spec.version}


def memory_mb(pid: int) -> float:
    """A process's resident memory, from /proc (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# -- the worker's side -------------------------------------------------------------------------

class ModelProcess:
    """The worker's handle on a model's process: a Backend (worker/backend.py) whose run is a `predict`."""

    def __init__(self, spec: ModelSpec, device: str, threads: int = 0, tcmalloc: bool = False):
        self.spec, self.device, self.threads = spec, device, threads
        self.tcmalloc = tcmalloc and device == "cpu"  # worker/allocator.py
        self.timeout_s = float(spec.config.get("predict_timeout_s", _task_timeout(spec)))
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.loaded: dict[str, Any] = {}  # what the process said once loaded: memory, library versions
        self.description = f"python ({spec.task}) in its own process on {device}"
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        if self.threads:  # what torch, numpy's BLAS and onnxruntime read as they start
            env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads),
                       OPENBLAS_NUM_THREADS=str(self.threads))
        if self.tcmalloc:
            env = allocator.with_tcmalloc(env) or env
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "funnel.worker.model_process",
                                             str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
                                            stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock = ours
        started = time.monotonic()
        try:
            send(ours, {"spec": spec_message(self.spec), "device": self.device})
            answer = self._receive(LOAD_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError) as exc:
            self.close()
            raise RuntimeError(f"the model's process ended while loading: {self._ended(exc)}") from None
        if "error" in answer:
            self.close()
            raise RuntimeError(f"load failed: {answer['error']['message']}")
        self.loaded = answer
        log.info("%s version %d loaded in its process (pid %d) in %.2f s, holding %.0f MB%s", self.spec.name,
                 self.spec.version, self.process.pid, time.monotonic() - started, memory_mb(self.process.pid),
                 f" and {answer['cuda_mb']:.0f} MB of {self.device}" if answer.get("cuda_mb") else "")

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        if self.process is None or self.process.poll() is not None:
            self.close()
            self._start()  # after a timeout or a death: the model loaded again
        assert self.sock is not None
        try:
            send(self.sock, {"feeds": dict(feeds)})
            answer = self._receive(self.timeout_s)
        except TimeoutError:
            self.close()
            raise Abandoned(f"predict took longer than {self.timeout_s:g} s (the task's predict_timeout_s): "
                            f"ended, and the model is loaded again", code="predict_timeout", status=504) from None
        except (OSError, EOFError) as exc:
            why = self._ended(exc)
            self.close()
            raise Abandoned(f"the model's process died in predict ({why}); it is started again") from None
        if "error" in answer:
            error = answer["error"]
            raise FunnelError(error["message"], code=error["code"], status=error["status"])
        return answer["rows"]

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self.sock is not None
        self.sock.settimeout(timeout_s)  # past it, TimeoutError
        return receive(self.sock)

    def _ended(self, exc: BaseException) -> str:
        """How the process ended, or the socket error if it has not."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return f"{type(exc).__name__}: {exc}"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def close(self) -> None:
        """End the process (evicting the model) and wait for its exit: its memory is the system's again."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        process, self.process = self.process, None
        if process is None:
            return
        held = memory_mb(process.pid)
        if process.poll() is None:
            process.kill()
        process.wait()
        if held:
            log.info("%s version %d: its process (pid %d) ended, %.0f MB freed", self.spec.name,
                     self.spec.version, process.pid, held)


def _task_timeout(spec: ModelSpec) -> float:
    from funnel.common import tasks

    return tasks.task_class(spec.task).predict_timeout_s


# -- the model's side --------------------------------------------------------------------------

def _die_with_parent() -> None:
    """End this process within WATCH_S of the worker's death (even by SIGKILL), whatever it is doing. Polled:
    the kernel's parent-death signal follows the thread that started the process, and a worker's loads run
    on threads that end."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent watch", daemon=True).start()


def rows_of(predicted: Any, count: int, name: str) -> list[dict[str, Any]]:
    """predict's answer as one row, a dict of named outputs, per item."""
    if isinstance(predicted, Mapping) or isinstance(predicted, (str, bytes)):
        raise TypeError(f"predict must return one row per item (a list, or an array with the batch first), "
                        f"not a {type(predicted).__name__}")
    rows = list(predicted)
    if len(rows) != count:
        raise RuntimeError(f"predict returned {len(rows)} rows for {count} items")
    return [dict(row) if isinstance(row, Mapping) else {name: row} for row in rows]


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, FunnelError):
        return {"code": exc.code, "message": exc.message, "status": exc.status}
    return {"code": "inference_failed", "message": f"{type(exc).__name__}: {exc}", "status": 500}


def _cuda_mb(device: str) -> float:
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda"):
        return 0.0
    return torch.cuda.memory_reserved(torch.device(device)) / 1e6


def main(fd: int) -> int:
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = socket.socket(fileno=fd)
    from funnel.common import tasks

    hello = receive(sock)
    spec = ModelSpec(**{**hello["spec"], "path": Path(hello["spec"]["path"])})
    try:
        task = tasks.load(spec)
        model = task.load(hello["device"])
    except Exception as exc:
        log.exception("loading %s version %d failed", spec.name, spec.version)
        send(sock, {"error": _error(exc)})
        return 1
    send(sock, {"ok": True, "cuda_mb": _cuda_mb(hello["device"])})
    name = (spec.config.get("outputs") or ["output"])[0]
    while True:
        try:
            feeds = receive(sock)["feeds"]
        except (EOFError, OSError):
            return 0  # the worker closed: the model is evicted, or the worker gone
        count = len(next(iter(feeds.values())))
        try:
            send(sock, {"rows": rows_of(task.predict(model, feeds), count, name)})
        except (BrokenPipeError, ConnectionResetError):
            return 0
        except Exception as exc:  # the call fails, the model serves on
            if not isinstance(exc, FunnelError):
                log.exception("predict failed on %d items", count)
            send(sock, {"error": _error(exc)})


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
