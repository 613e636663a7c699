"""`funnel-grpc` (or `python -m funnel.web.grpc`): the Open Inference Protocol's gRPC service.

One process, one event loop (uvloop's): a grpc.aio server whose ModelInfer takes
the web tier's pipeline (web/pipeline.py) with its own Redis client, inbox and
outbox, as one web process does. It reads every FUNNEL_* setting the web tier
reads (the store, the models, the limits, the API keys, the deadlines) and
listens on FUNNEL_HOST:FUNNEL_GRPC_PORT. A message larger than
FUNNEL_MAX_BODY_MB is refused by gRPC itself (RESOURCE_EXHAUSTED) before it
is read. SIGTERM or SIGINT refuses new calls (UNAVAILABLE) and answers those in
flight, up to FUNNEL_REQUEST_TIMEOUT_S + 5 s, then exits 0; a call that
reaches it in the instant it stops may be CANCELLED by gRPC, never queued.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

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
    # No grace: what is left are refusals, and calls gRPC holds for a handler that will not take them.
    await server.stop(grace=None)


def main(argv: list[str] | None = None) -> int:
    config = GrpcSettings.load(argv)
    logs.configure(config.log_level, config.log_format)
    # uvloop, as the web tier's event loops: grpc.aio's calls cost less CPU on it than on asyncio's own.
    uvloop.run(serve(config))
    return 0
