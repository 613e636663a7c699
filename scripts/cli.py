"""`funnel <command>`: one entry point for everything Funnel runs.

    funnel up        Redis, the web tier and one worker per model (what `make up` runs)
    funnel web       the web tier alone (also `funnel-web`)
    funnel worker    one worker daemon (also `funnel-worker`)
    funnel prepare   build the model store from the weights Funnel ships with
    funnel add       add your own ONNX / TorchScript model, with its task, to the store
    funnel inspect   queues, in-flight jobs, dead letters and workers, from Redis
    funnel client    ask a server for answers (the funnel-client distribution's CLI)
    funnel stress    many concurrent clients against a server, with latency figures

`funnel <command> --help` tells each command's flags.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, help); imported only when chosen, so `funnel inspect` never loads torch.
COMMANDS = {
    "up": ("funnel.scripts.stack", "Redis, the web tier and one worker per model"),
    "web": ("funnel.web.server", "the web tier (gunicorn + Flask)"),
    "worker": ("funnel.worker.main", "one worker daemon"),
    "prepare": ("funnel.scripts.prepare_model", "build the model store from the packaged weights"),
    "add": ("funnel.scripts.add_model", "add your own ONNX / TorchScript model to the store"),
    "inspect": ("funnel.scripts.inspect_redis", "look inside Redis"),
    "client": ("funnel_client.cli", "ask a server for answers"),
    "stress": ("funnel.scripts.stress_test", "load a server with concurrent clients"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
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
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as exc:
        # e.g. the web extra without the worker's: README, "Installing", lists the extras.
        print(f"funnel {command}: needs {exc.name}, which is not installed here", file=sys.stderr)
        return 1
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
