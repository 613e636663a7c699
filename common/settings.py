"""Settings from FUNNEL_* environment variables, each mirrored by a CLI flag.

A process declares one dataclass; every field becomes `--field-name` with the
default taken from `FUNNEL_FIELD_NAME` when set. Flags win over variables,
variables over defaults. Nothing else in the code reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Settings = TypeVar("Settings", bound="DataclassInstance")
ENV_PREFIX = "FUNNEL_"


def setting(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (shown by --help)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata={"help": help, **extra})
    return dataclasses.field(default=default, metadata={"help": help, **extra})


@dataclasses.dataclass(kw_only=True)
class SharedSettings:
    """What every Funnel process needs to know: its Redis, its keys, its models, its log level.

    WebSettings and WorkerSettings extend this; a field both tiers read is declared here, once.
    """

    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis URL (redis://, or rediss:// for TLS; "
                             "a password may be given as redis://:PASSWORD@host), or the Sentinels of a primary: "
                             "redis+sentinel://[:PASSWORD@]HOST:26379,HOST:26379/SERVICE/DB (docs/redis.md)")
    prefix: str = setting("funnel", "prefix of every Redis key")
    model_store: str = setting("model_store", "model store directory (one folder per model)")
    log_level: str = setting("info", "logging level (debug, info, warning, error)")
    log_format: str = setting("text", "log lines as text, or json: one JSON object per line", choices=("text", "json"))
    webhook_secret: str = setting("", "shared secret that signs job webhooks (HMAC-SHA256, the "
                                  "Funnel-Signature header); without it, a submit naming a webhook is refused",
                                  secret=True)
    webhook_allow_hosts: list[str] = setting([], "webhook destinations allowed although private, loopback or "
                                             "link-local: host names, addresses or networks, comma-separated")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parser_for(kind: Any):
    if kind is bool:
        return _parse_bool
    if typing.get_origin(kind) is list or kind is list:
        return _parse_list
    return kind


def load(cls: type[Settings], argv: list[str] | None = None,
         environ: Mapping[str, str] | None = None, prog: str | None = None) -> Settings:
    """Build `cls` from defaults, then FUNNEL_* variables, then flags."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    defaults: dict[str, Any] = {}  # repeatable flags' values when none is given
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        parse = _parser_for(hints[field.name])
        env = env_name(field.name)
        default = (field.default if field.default is not dataclasses.MISSING
                   else field.default_factory())  # type: ignore[operator]  # MISSING checked above
        if env in environ:
            try:
                default = parse(environ[env])
            except ValueError as exc:
                parser.error(f"{env}: {exc}")
        flag = "--" + field.name.replace("_", "-")
        shown = "(set)" if field.metadata.get("secret") and default else repr(default)  # never print a secret
        help_text = f"{field.metadata.get('help', '')} [env {env}, default {shown}]"
        if hints[field.name] is bool:
            parser.add_argument(flag, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        elif field.metadata.get("repeat"):  # a list flag given again adds to it: --model a --model b
            parser.add_argument(flag, default=None, type=parse, help=help_text, action="extend")
            defaults[field.name] = default
        else:
            parser.add_argument(flag, default=default, type=parse, help=help_text,
                                choices=field.metadata.get("choices"))
    args = vars(parser.parse_args(argv))
    for name, default in defaults.items():  # flags not given: the variable's, or the default
        if args[name] is None:
            args[name] = default
    return cls(**args)
