"""funnel-grpc's settings: the web tier's, and its port.

A module of its own, free of the generated messages: what reads the settings (`funnel up`, the
deploy tests) need not load them into protobuf's default pool, where tritonclient's messages of
the same package would then clash with them in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from funnel.common import settings
from funnel.common.settings import setting
from funnel.web.settings import WebSettings


@dataclass(kw_only=True)
class GrpcSettings(WebSettings):
    """The Open Inference Protocol over gRPC, through the web tier's pipeline: the web tier's settings,
    and its port."""

    grpc_port: int = setting(8001, "port the gRPC service listens on (at FUNNEL_HOST)")

    @classmethod
    def load(cls, argv: list[str] | None = None) -> GrpcSettings:
        return settings.load(cls, argv, prog="funnel-grpc")
