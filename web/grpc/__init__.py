"""The Open Inference Protocol over gRPC: `funnel-grpc`, beside the HTTP web tier, on the same pipeline.

    open_inference.proto   the protocol's service and messages; open_inference_pb2*.py generated from it
                           (generate.py), committed
    messages.py            a ModelInferRequest's tensors read (sizes checked first), an answer's written
    service.py             GRPCInferenceService: health, metadata, ModelInfer through web/pipeline.py,
                           every failure as the protocol's status code
    settings.py            GrpcSettings: the web tier's, and FUNNEL_GRPC_PORT
    server.py              the process: a grpc.aio server on one event loop, a graceful stop
"""
