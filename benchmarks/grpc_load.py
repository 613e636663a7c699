"""A load generator for the gRPC service, as wrk is for HTTP: N calls in flight for D seconds.

    python -m benchmarks.grpc_load HOST:PORT --concurrency 32 --duration 10 [--items 1]

Sends one ModelInferRequest to text-embedding, over and over, from N coroutines
on one grpc.aio channel (HTTP/2 streams on one connection, as a gRPC client
keeps them): the sentence of benchmarks/core.py in raw_input_contents, the
message serialized once and sent as bytes, the answer not parsed, so the
client costs as little CPU per call as Python's gRPC allows. Prints one JSON
line: {"rps", "errors", "p50", "p99"} (latencies in ms). Run it in a process
of its own: Funnel's messages load into protobuf's default pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time

import grpc

from benchmarks.core import SENTENCE

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request_bytes(items: int) -> bytes:
    from funnel.web.grpc import open_inference_pb2 as pb

    text = SENTENCE.encode()
    tensor = pb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[items])
    raw = (struct.pack("<I", len(text)) + text) * items
    return pb.ModelInferRequest(model_name="text-embedding", inputs=[tensor],
                                raw_input_contents=[raw]).SerializeToString()


async def load(target: str, concurrency: int, duration_s: float, body: bytes) -> dict:
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD)  # bytes in, bytes out: no (de)serializing on the client
        await call(body, timeout=30)  # connected, and the path warm

        async def client(until: float) -> None:
            nonlocal errors
            while time.perf_counter() < until:
                started = time.perf_counter()
                try:
                    await call(body, timeout=30)
                except grpc.RpcError:
                    errors += 1
                else:
                    latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client(started + duration_s) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    pick = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000) if latencies \
        else (lambda q: float("nan"))
    return {"rps": len(latencies) / elapsed, "errors": errors, "p50": pick(0.5), "p99": pick(0.99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_load", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="HOST:PORT of funnel-grpc")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--items", type=int, default=1, help="sentences per call")
    args = parser.parse_args(argv)
    result = asyncio.run(load(args.target, args.concurrency, args.duration, request_bytes(args.items)))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
