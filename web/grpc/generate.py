"""Regenerate open_inference_pb2.py, its .pyi and open_inference_pb2_grpc.py from open_inference.proto, and
model_config_pb2.py and its .pyi from model_config.proto (Triton's, which it imports).

    python -m funnel.web.grpc.generate [--check]

The generated modules are committed, so that a web host needs grpcio and
protobuf only, never the compiler (grpcio-tools, the test extra); --check
fails when they differ from what the .proto makes (tests/unit/test_grpc_proto.py).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "open_inference.proto"
PROTOS = (PROTO, "model_config.proto")
PACKAGE = Path("funnel", "web", "grpc")  # the import path the generated modules name each other by
OUTPUTS = ("open_inference_pb2.py", "open_inference_pb2.pyi", "open_inference_pb2_grpc.py", "model_config_pb2.py",
           "model_config_pb2.pyi")


def generate(into: Path) -> None:
    from grpc_tools import protoc

    source = into / "src"
    (source / PACKAGE).mkdir(parents=True)
    for proto in PROTOS:
        shutil.copy(HERE / proto, source / PACKAGE / proto)
    status = protoc.main(["protoc", f"-I{source}", f"--python_out={into}", f"--pyi_out={into}",
                          f"--grpc_python_out={into}", str(source / PACKAGE / PROTO)])
    if status == 0:  # the configuration has no service: its messages only
        status = protoc.main(["protoc", f"-I{source}", f"--python_out={into}", f"--pyi_out={into}",
                              str(source / PACKAGE / PROTOS[1])])
    if status != 0:
        raise SystemExit(f"protoc failed with {status}")


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [name for name in OUTPUTS
                 if not (HERE / name).is_file()
                 or (Path(tmp) / PACKAGE / name).read_bytes() != (HERE / name).read_bytes()]
        if check:
            if stale:
                print(f"stale: {', '.join(stale)}; run python -m funnel.web.grpc.generate", file=sys.stderr)
            return 1 if stale else 0
        for name in OUTPUTS:
            shutil.copy(Path(tmp) / PACKAGE / name, HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
