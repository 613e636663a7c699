"""`funnel up` starts the gRPC service beside the web tier, on FUNNEL_GRPC_PORT or --grpc-port; --no-grpc
starts none. The service itself is tests/integration/test_grpc_inference.py's."""

from __future__ import annotations

from pathlib import Path

from funnel.common import settings
from funnel.scripts import stack
from funnel.web.grpc.settings import GrpcSettings


def a_store(tmp_path: Path) -> Path:
    (tmp_path / "text-embedding").mkdir()
    (tmp_path / "text-embedding" / "model.json").write_text("{}")
    return tmp_path


def test_funnel_up_starts_grpc_on_its_port_by_default(tmp_path):
    up = stack.build(["--model-store", str(a_store(tmp_path)), "--no-front-door"], environ={})
    assert up.grpc_port == GrpcSettings.grpc_port == 8001


def test_the_port_from_the_environment_or_the_option(tmp_path):
    store = str(a_store(tmp_path))
    assert stack.build(["--model-store", store, "--no-front-door"], environ={"FUNNEL_GRPC_PORT": "9001"}).grpc_port \
        == 9001
    assert stack.build(["--model-store", store, "--no-front-door", "--grpc-port", "9002"],
                       environ={"FUNNEL_GRPC_PORT": "9001"}).grpc_port == 9002
    assert stack.build(["--model-store", store, "--no-front-door", "--no-grpc"], environ={}).grpc_port is None


def test_the_grpc_process_reads_the_web_tiers_settings(tmp_path):
    """Started with the web tier's environment (API keys, limits) and its own port."""
    up = stack.build(["--model-store", str(a_store(tmp_path)), "--no-front-door", "--grpc-port", "9003"],
                     environ={"FUNNEL_API_KEYS": "k", "FUNNEL_MAX_ITEMS": "9"})
    read = settings.load(GrpcSettings, [], environ=up.grpc_environment())
    assert (read.grpc_port, read.api_keys, read.max_items) == (9003, ["k"], 9)
