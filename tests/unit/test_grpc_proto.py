"""web/grpc/: the committed generated modules are what the .protos make, and the .protos are the protocol's.

The protocol's messages are compared, field by field, with those tritonclient[grpc] was generated
from (Triton's grpc_service.proto and model_config.proto): same names, numbers, types and
cardinality, so that either side's messages read the other's bytes. The two cannot share a process
(both declare package `inference` in protobuf's default pool), so Funnel's are described by a child
process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from funnel.web.grpc import generate

DESCRIBE = """
import json
from funnel.web.grpc import model_config_pb2 as config
from funnel.web.grpc import open_inference_pb2 as pb

def fields(message):
    out = {f.name: [f.number, f.type, f.label, f.message_type.full_name if f.message_type else None]
           for f in message.fields}
    for nested in message.nested_types:
        if not nested.GetOptions().map_entry:
            yield from fields(nested)
    yield message.full_name, out

print(json.dumps(dict(kv for module in (pb, config) for m in module.DESCRIPTOR.message_types_by_name.values()
                      for kv in fields(m))))
print(json.dumps({m.name: [m.input_type.full_name, m.output_type.full_name]
                  for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}))
"""


def test_generated_modules_are_current():
    assert generate.main(["--check"]) == 0


def test_a_stale_module_is_found(tmp_path, monkeypatch):
    for name in (*generate.PROTOS, *generate.OUTPUTS):
        shutil.copy(generate.HERE / name, tmp_path / name)
    with open(tmp_path / generate.OUTPUTS[0], "a") as module:
        module.write("# edited by hand\n")
    monkeypatch.setattr(generate, "HERE", tmp_path)
    assert generate.main(["--check"]) == 1


def test_messages_and_service_match_tritons():
    from tritonclient.grpc import service_pb2
    described = subprocess.run([sys.executable, "-c", DESCRIBE], capture_output=True, text=True, check=True)
    ours, methods = map(json.loads, described.stdout.splitlines())
    pool = service_pb2.DESCRIPTOR.pool
    for full_name, fields in ours.items():
        theirs = pool.FindMessageTypeByName(full_name)
        for name, (number, kind, label, message) in fields.items():
            field = theirs.fields_by_name[name]
            assert [field.number, field.type, field.label] == [number, kind, label], f"{full_name}.{name}"
            assert (field.message_type.full_name if field.message_type else None) == message
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for name, (request, response) in methods.items():
        method = service.methods_by_name[name]
        assert [method.input_type.full_name, method.output_type.full_name] == [request, response]
    assert len(ours) >= 17 and set(methods) == {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
                                                "ModelMetadata", "ModelInfer", "ModelStreamInfer", "ModelConfig",
                                                "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
                                                "RepositoryModelUnload"}
    assert "inference.ModelConfig" in ours and "inference.ModelStatistics" in ours


def test_the_settings_leave_the_messages_unimported():
    """`funnel up` and the deploy tests read GrpcSettings in processes that may load tritonclient's
    messages of the same package: the settings must not load Funnel's."""
    check = ("import sys, funnel.web.grpc.settings, funnel.scripts.stack; "
             "assert 'funnel.web.grpc.open_inference_pb2' not in sys.modules")
    subprocess.run([sys.executable, "-c", check], check=True)
