"""GRPCInferenceService: the Open Inference Protocol's RPCs, answered through web/pipeline.py.

    ServerLive, ServerReady          open, as /v2/health is (ready: every model has a live worker, and the
                                     process is not stopping)
    ServerMetadata, ModelMetadata    what GET /v2 and GET /v2/models/<name> say
    ModelReady                       whether a live worker serves the model (version)
    ModelInfer                       Pipeline.infer with this module's parser, rendered as /v2 renders
                                     (protocols/v2.py), in raw_output_contents
    ModelStreamInfer                 Triton's stream: each request of it as ModelInfer's, answered as it
                                     is done, a failure in error_message, the stream going on
    ModelConfig, ModelStatistics     Triton's, as GET /v2/models/<name>/config and /stats answer them
                                     (web/introspection.py), parsed into Triton's messages
    RepositoryIndex                  Triton's repository extension, as POST /v2/repository/index, .../load and
    RepositoryModelLoad, ...Unload   .../unload answer them (web/repository.py); load and unload for admin keys

Every other RPC needs an API key where FUNNEL_API_KEYS is set, in the call's
`authorization` metadata (`Bearer <key>`). A failure is the protocol's status
code (STATUS below), with /v1's message; a 503's Retry-After travels in the
trailing metadata `retry-after`. A deadline the client sets is the request's
deadline, never past FUNNEL_REQUEST_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import redis
from google.protobuf import json_format

from funnel.common.contracts import priority
from funnel.common.errors import BadInput, FunnelError, Unavailable, queue_unavailable
from funnel.common.observability import logs
from funnel.common.tasks import Task
from funnel.web import auth, errors, introspection, readiness, repository
from funnel.web.grpc import open_inference_pb2 as pb
from funnel.web.grpc import open_inference_pb2_grpc as pb_grpc
from funnel.web.grpc.messages import infer_response, outputs_header, parameter, read_inputs
from funnel.web.grpc.model_config_pb2 import ModelConfig
from funnel.web.pipeline import Answered, Origin, Pipeline, Work
from funnel.web.protocols import v2
from funnel.web.queueing.cache_plan import x_cache

log = logging.getLogger("funnel.web.grpc")

# HTTP statuses Funnel's errors carry, as the gRPC codes that mean the same (gRPC's own HTTP mapping).
STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}

Answer = TypeVar("Answer")
WAKE = pb.ModelStreamInferResponse()  # put on each open stream's answers when the server starts stopping


class InferParser:
    """ModelInferRequest -> the pipeline's Work, as /v2's adapter reads its JSON (protocols/v2.py)."""

    def __init__(self, max_items: int):
        self.max_items = max_items

    def parse(self, task: Task, request: pb.ModelInferRequest) -> Work[v2.Wanted]:
        # Counted before any is read: a huge repeated field costs no more than receiving it did.
        inputs, outputs = 1 + len(v2.fixed_inputs(task)), len(task.output_shapes())
        if len(request.inputs) > inputs or len(request.outputs) > outputs:
            raise BadInput(f"{len(request.inputs)} inputs and {len(request.outputs)} outputs; {task.spec.name} "
                           f"takes at most {inputs} and gives {outputs}", code="bad_tensor")
        wanted = v2.Wanted(v2.requested_outputs(task, outputs_header(request)))  # the id: the message's own
        work = v2.items_of(task, read_inputs(request, self.max_items), self.max_items, wanted)
        if "priority" in request.parameters:  # as tritonclient sends it: Triton's number, or a lane's name
            work.lane = priority.parse(parameter(request.parameters["priority"]))
        return work


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """A failure as the call's status code, message and trailing metadata."""
    if isinstance(exc, redis.RedisError):
        exc = queue_unavailable(exc)
    if isinstance(exc, FunnelError):
        retry = (("retry-after", errors.retry_after(exc)),) if exc.status in (429, 503) else ()
        return STATUS.get(exc.status, grpc.StatusCode.INTERNAL), exc.message, retry
    log.exception("gRPC call failed", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error (the server's log has the details)", ()


def stopping() -> Unavailable:
    """The refusal of a server that is stopping (a new one each time: a raised exception keeps its
    traceback)."""
    return Unavailable("this server is stopping; call again")


def stream_failure(request: pb.ModelInferRequest, exc: Exception) -> pb.ModelStreamInferResponse:
    """A stream request's failure, as the stream answers it: the message, under the request's id."""
    which = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    return pb.ModelStreamInferResponse(error_message=status_of(exc)[1], infer_response=which)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.settings = pipeline.settings
        self.parser = InferParser(self.settings.max_items)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.draining = False
        self.streams: set[asyncio.Queue] = set()  # each open stream's answers, woken when stopping

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls with UNAVAILABLE (the status clients retry, on the process that replaces
        this one) and wait, up to timeout_s, until every call accepted has its answer sent."""
        self.draining = True
        for stream in self.streams:  # wakes each stream to end once its requests are answered
            stream.put_nowait((WAKE, 0))
        if self.in_flight:  # no call is accepted from now on: the count only falls
            self.idle.clear()
            try:
                await asyncio.wait_for(self.idle.wait(), timeout_s)
            except TimeoutError:
                log.warning("stopping with %d calls still in flight", self.in_flight)

    async def _answer(self, context: grpc.aio.ServicerContext,
                      answer: Callable[[Origin], Awaitable[Answer]]) -> Answer:
        """answer(origin)'s result, once the call's key is checked; or the call ended with the status
        its failure maps to."""
        try:
            self._accept()
            context.add_done_callback(lambda _: self._sent())
            return await answer(self._origin(context))
        except Exception as exc:  # every failure is a status, never a traceback to the client
            code, message, trailing = status_of(exc)
        await context.abort(code, message, trailing_metadata=trailing)
        raise AssertionError("abort() raises")  # for the type checker: abort never returns

    def _accept(self) -> None:
        """Count one call (a stream is one) in flight until _sent(): what drain() waits for.
        UNAVAILABLE while the server is stopping, and then not counted: a refusal may be cut off,
        as the client is told UNAVAILABLE either way."""
        if self.draining:
            raise stopping()
        self.in_flight += 1

    def _sent(self) -> None:
        """An accepted call has ended, its status sent (gRPC's done callback)."""
        self.in_flight -= 1
        if not self.in_flight:
            self.idle.set()

    def _origin(self, context: grpc.aio.ServicerContext) -> Origin:
        """The call's key (UNAUTHENTICATED without one, where FUNNEL_API_KEYS is set), request id and
        trace context, from its metadata."""
        metadata = {k: str(v) for k, v in context.invocation_metadata() or ()}
        request_id = logs.request_id_of(metadata.get("x-request-id"))
        logs.REQUEST_ID.set(request_id)
        return Origin.of(request_id, metadata.get("authorization", ""), self.settings.api_keys,
                         metadata.get("traceparent", ""), metadata.get("tracestate", ""), metadata.get("x-priority"))

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        if self.draining:  # stopping: send calls elsewhere
            return pb.ServerReadyResponse(ready=False)
        try:
            missing = await asyncio.to_thread(readiness.models_without_workers, self.pipeline)
        except redis.RedisError:
            missing = ["redis"]
        return pb.ServerReadyResponse(ready=not missing)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        async def answer(origin: Origin):
            return pb.ServerMetadataResponse(name="funnel", version=v2.server_version(), extensions=v2.EXTENSIONS)
        return await self._answer(context, answer)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        async def answer(origin: Origin):
            task = self.pipeline.resolve(request.name, request.version or None)
            meta = v2.metadata(task, sorted(self.pipeline.catalog.versions(request.name)))
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
                outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]])
        return await self._answer(context, answer)

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        async def answer(origin: Origin):
            live = await asyncio.to_thread(readiness.model_live, self.pipeline, request.name, request.version or None)
            return pb.ModelReadyResponse(ready=live)
        return await self._answer(context, answer)

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        async def answer(origin: Origin):
            return await self.pipeline.infer(self.parser, request, request.model_name, request.model_version or None,
                                             lambda: self._timeout_s(context), origin, self._render(request))
        return await self._answer(context, answer)

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request of the stream answered under its id as soon as its own items are done, in whatever
        order they finish; a failure is that request's error_message, and the stream goes on. The stream
        ending, or cancelled, cancels its requests still waiting: their jobs are marked, as a client's that
        left (web/pipeline.py). The whole stream is one call in flight: once the server is stopping, it
        refuses further requests, answers those it took, then ends UNAVAILABLE."""
        try:
            self._accept()
            context.add_done_callback(lambda _: self._sent())
            origin = self._origin(context)
        except FunnelError as exc:
            code, message, trailing = status_of(exc)
            await context.abort(code, message, trailing_metadata=trailing)
        # Each answer with whether its request was taken (1) or refused (0); None: the stream is over.
        answered: asyncio.Queue[tuple[pb.ModelStreamInferResponse, int] | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()
        taken = 0  # requests taken and not yet answered on the stream

        async def one(request: pb.ModelInferRequest) -> None:
            try:
                answer = pb.ModelStreamInferResponse(infer_response=await self.pipeline.infer(
                    self.parser, request, request.model_name, request.model_version or None,
                    lambda: self.settings.request_timeout_s, origin, self._render(request)))
            except Exception as exc:  # this request's failure, on the stream that goes on
                answer = stream_failure(request, exc)
            await answered.put((answer, 1))

        async def read() -> None:
            nonlocal taken
            async for request in requests:
                if self.draining:  # stopping: this request refused, those taken still answered
                    await answered.put((stream_failure(request, stopping()), 0))
                    continue
                taken += 1
                task = asyncio.create_task(one(request))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(set(running))
            await answered.put(None)

        reader = asyncio.create_task(read())
        self.streams.add(answered)
        try:
            while not (self.draining and not taken):
                if (next_answer := await answered.get()) is None:
                    return
                response, counted = next_answer
                if response is not WAKE:
                    taken -= counted
                    yield response
        finally:  # the stream is over or cancelled: whatever still waits is nobody's
            self.streams.discard(answered)
            reader.cancel()
            for task in list(running):
                task.cancel()
        code, message, trailing = status_of(stopping())
        await context.abort(code, message, trailing_metadata=trailing)

    @staticmethod
    def _render(request: pb.ModelInferRequest) -> Callable[[Task, Work[v2.Wanted], Answered], pb.ModelInferResponse]:
        """How a request's answer becomes its response, as /v2 renders it (protocols/v2.py)."""
        def render(task: Task, work: Work[v2.Wanted], answered: Answered) -> pb.ModelInferResponse:
            outputs, chunks = v2.outputs_of(task, work.kept.outputs, answered.replies)
            response = infer_response(task.spec.name, task.spec.version, request.id, outputs, chunks)
            if answered.cache:  # whether the result cache answered it, as /v2's parameters say
                response.parameters["cache"].string_param = x_cache(answered.cache).lower()
            return response
        return render

    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        return await self._read(context, lambda: pb.ModelConfigResponse(config=json_format.ParseDict(
            introspection.model_config(self.pipeline, request.name, request.version or None), ModelConfig())))

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        return await self._read(context, lambda: pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(**entry)
            for entry in repository.index(self.pipeline, request.ready)]))

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> pb.RepositoryModelLoadResponse:
        await self._change(context, request, repository.load)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> pb.RepositoryModelUnloadResponse:
        await self._change(context, request, repository.unload)
        return pb.RepositoryModelUnloadResponse()

    async def _change(self, context: grpc.aio.ServicerContext, request: Any,
                      change: Callable[[Pipeline, str, dict[str, Any], float], None]) -> None:
        """A repository change, on a thread (it waits for a drain or a worker), for an admin key only."""
        async def answer(origin: Origin) -> None:
            auth.require_admin(self.settings, auth.Identity(label=origin.label, owner=origin.owner))
            parameters = {key: getattr(value, chosen) for key, value in request.parameters.items()
                          if (chosen := value.WhichOneof("parameter_choice"))}
            await asyncio.to_thread(change, self.pipeline, request.model_name, parameters, self._timeout_s(context))
        await self._answer(context, answer)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        return await self._read(context, lambda: json_format.ParseDict(
            introspection.model_statistics(self.pipeline, request.name, request.version or None),
            pb.ModelStatisticsResponse()))

    async def _read(self, context: grpc.aio.ServicerContext, read: Callable[[], Answer]) -> Answer:
        """read()'s answer, on a thread (it reads Redis), once the call's key is checked."""
        async def answer(origin: Origin) -> Answer:
            return await asyncio.to_thread(read)
        return await self._answer(context, answer)

    def _timeout_s(self, context: grpc.aio.ServicerContext) -> float:
        """The call's deadline, if the client set one, capped by FUNNEL_REQUEST_TIMEOUT_S."""
        remaining = context.time_remaining()
        cap = self.settings.request_timeout_s
        return cap if remaining is None else max(0.001, min(remaining, cap))
