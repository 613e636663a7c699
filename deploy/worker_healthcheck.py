"""The worker image's HEALTHCHECK (and the Kubernetes worker probes): python /app/healthcheck.py.

Healthy while this container's worker keeps its heartbeat hash
(funnel:worker:{<model>}:<id>, expires unless refreshed) in Redis. The id is random
unless FUNNEL_WORKER_ID is set, so match the hash's "host" field: the
container's hostname. Reads the same FUNNEL_* variables as the worker (flags
given on the command line are not seen). Exit status 0: healthy; 1: not, with
the reason on stderr.
"""

import socket
import sys

from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import connect, scan_keys
from funnel.worker.settings import WorkerSettings


def main() -> None:
    host = socket.gethostname()
    try:
        settings = WorkerSettings.load([])
        client = connect(settings.redis_url, socket_timeout=3)
        pattern = Keys(settings.prefix).pattern("worker")  # funnel:worker:*
        with client.pipeline(transaction=False) as pipe:
            for key in scan_keys(client, pattern, count=1000):  # every primary of a cluster
                pipe.hget(key, "host")
            hosts = pipe.execute()
    except Exception as exc:  # Redis down or bad settings: not serving either way
        sys.exit(f"unhealthy: {exc}")
    if host.encode() not in hosts:
        sys.exit(f"unhealthy: no heartbeat from a worker on host {host}")


if __name__ == "__main__":
    main()
