"""`funnel <command>`: one entry point for everything Funnel runs.

    funnel up        Redis, the web tier, the gRPC service and the workers (what `make up` runs)
    funnel web       the web tier alone (also `funnel-web`)
    funnel grpc      the Open Inference Protocol's gRPC service alone (also `funnel-grpc`)
    funnel worker    one worker daemon (also `funnel-worker`)
    funnel prepare   build the model store from the weights Funnel ships with
    funnel add       add your own ONNX / TorchScript model, with its task, to the store
                     (--version N: as version N of the model, beside the others)
    funnel traffic   show or set a model's traffic policy: the share each version takes
    funnel inspect   models, versions, queues, in-flight jobs, dead letters and workers, from Redis
    funnel client    ask a server for answers (the funnel-client distribution's CLI)
    funnel stress    many concurrent clients against a server, with latency figures

`funnel <command> --help` tells each command's flags.
"""

from __future__ import annotations

import sys

from funnel.scripts import entry
from funnel.scripts.entry import PREPARE, WEB, WORKER

# command -> (module, help, the extras it needs); imported only when chosen, so `funnel inspect`
# never loads torch.
COMMANDS: dict[str, tuple[str, str, tuple[entry.Extra, ...]]] = {
    "up": ("funnel.scripts.stack", "Redis, the web tier, the gRPC service and the workers for each model",
           (WEB, WORKER)),
    "web": ("funnel.web.server", "the web tier (gunicorn + Flask)", (WEB,)),
    "grpc": ("funnel.web.grpc.server", "the Open Inference Protocol over gRPC (port 8001)", (WEB,)),
    "worker": ("funnel.worker.main", "one worker daemon", (WORKER,)),
    "prepare": ("funnel.scripts.prepare_model", "build the model store from the packaged weights", (PREPARE,)),
    "add": ("funnel.scripts.add_model", "add your own ONNX / TorchScript model (or a version of one) to the store",
            ()),
    "traffic": ("funnel.scripts.traffic", "show, set or clear a model's traffic weights per version", ()),
    "inspect": ("funnel.scripts.inspect_redis", "look inside Redis", ()),
    "client": ("funnel_client.cli", "ask a server for answers", ()),
    "stress": ("funnel.scripts.stress_test", "load a server with concurrent clients", ()),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text, _) in COMMANDS.items()]
    return "usage: funnel <command> [flags]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"funnel: unknown command {command!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    module, _, extras = COMMANDS[command]
    try:
        return entry.run(f"funnel {command}", extras, module, rest)
    except ModuleNotFoundError as exc:
        # A module the command reaches for only on some paths, e.g. `funnel add --onnx` needs
        # onnxruntime; a module of Funnel's own missing is a bug, so its traceback stays.
        if not exc.name or exc.name.partition(".")[0] == "funnel":
            raise
        extra = entry.extra_of(exc.name, first=extras)
        if extra:
            print(entry.missing_message(f"funnel {command}", [extra], exc.name), file=sys.stderr)
        elif exc.name.partition(".")[0] == "funnel_client":
            print(f"funnel {command} needs the client, a distribution of its own: pip install ./client "
                  "(from Funnel's source)", file=sys.stderr)
        else:
            print(f"funnel {command}: needs {exc.name}, which is not installed here", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
