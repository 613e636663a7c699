"""`funnel-grpc` (or `python -m funnel.web.grpc`): the Open Inference Protocol's gRPC service.

One process, one event loop (uvloop's): a grpc.aio server whose ModelInfer takes
the web tier's pipeline (web/pipeline.py) with its own Redis client, inbox and
outbox, as one web process does. It reads every FUNNEL_* setting the web tier
reads (the store, the models, the limits, the API keys, the deadlines) and
listens on FUNNEL_HOST:FUNNEL_GRPC_PORT. A message larger than
FUNNEL_MAX_BODY_MB is refused by gRPC itself (RESOURCE_EXHAUSTED) before it
is read. SIGTERM or SIGINT refuses new calls (UNAVAILABLE) and answers those in
flight, up to FUNNEL_REQUEST_TIMEOUT_S + 5 s, then closes its connections and
exits 0: a call sent meanwhile ends UNAVAILABLE, never CANCELLED (stop() below).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket

import grpc
import uvloop

from funnel.common.observability import logs
from funnel.web.grpc.service import InferenceService
from funnel.web.grpc.settings import GrpcSettings

log = logging.getLogger("funnel.web.grpc")

# As the web tier's (web/server.py): no command blocks in Redis for over a second, so a Redis that
# stops answering costs a call this long, then UNAVAILABLE.
HUNG_REDIS_S = 3.0


def build_server(config: GrpcSettings) -> tuple[grpc.aio.Server, InferenceService, int]:
    """The server with the service added and its port bound (the port, for a port of 0); nothing
    started yet."""
    from funnel.common.contracts.keys import Keys
    from funnel.common.link.connection import connect, on_cluster
    from funnel.web.app import catalog_of
    from funnel.web.grpc import open_inference_pb2_grpc as pb_grpc
    from funnel.web.pipeline import Pipeline

    client = connect(config.redis_url, socket_timeout=HUNG_REDIS_S)
    pipeline = Pipeline(catalog_of(config), client, Keys(config.prefix, cluster=on_cluster(client)), config)
    max_bytes = int(config.max_body_mb * 1024 * 1024)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_metadata_size", 64 * 1024),  # as the HTTP front's limit on a request's head
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a second server sharing it unseen
    ])
    service = InferenceService(pipeline)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"{config.host}:{config.grpc_port}")
    if not port:
        raise SystemExit(f"funnel-grpc: cannot listen on {config.host}:{config.grpc_port}")
    return server, service, port


async def serve(config: GrpcSettings) -> None:
    server, service, port = build_server(config)
    await server.start()
    # What is loaded by now lives as long as the process: the collector's full passes skip it.
    gc.freeze()
    log.info("funnel-grpc listening on %s:%d", config.host, port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("funnel-grpc stopping: answering the calls in flight")
    await service.drain(config.request_timeout_s + 5)
    close_connections(port)
    await server.stop(grace=None)


def close_connections(port: int) -> None:
    """Stop listening on `port` and end each connection to it after what was sent on it (FIN).

    gRPC's own stop cancels (CANCELLED, a status no client may retry) every call that reaches it
    after the stop began and before the client has read its GOAWAY, and clients keep calling a
    draining process, whose refusals they retry. Once the accepted calls are answered, this ends
    the connections under gRPC instead: a call sent on one is told UNAVAILABLE by the client's own
    transport, and whatever gRPC's stop cancels next can no longer be written to anyone. gRPC
    exposes no socket, so they are found among the process's descriptors (Linux's /proc; elsewhere
    gRPC's stop alone). gRPC then logs its closed acceptor as an error ("Failed accept4"): expected.
    """
    try:
        descriptors = os.listdir("/proc/self/fd")
    except FileNotFoundError:
        return
    for fd in descriptors:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # a descriptor closed since the listing
            continue
        with sock:
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.getsockname()[1] != port:
                    continue
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                sock.shutdown(socket.SHUT_RDWR if listening else socket.SHUT_WR)
            except OSError:  # not connected, or already closed by its peer
                continue


def main(argv: list[str] | None = None) -> int:
    config = GrpcSettings.load(argv)
    logs.configure(config.log_level, config.log_format)
    # uvloop, as the web tier's event loops: grpc.aio's calls cost less CPU on it than on asyncio's own.
    uvloop.run(serve(config))
    return 0
