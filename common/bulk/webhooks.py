"""Webhooks on a job's completion: where one may go, how it is signed, how it becomes due.

The web tier checks a webhook URL at submit (400 when refused); the worker's
deliverer (worker/webhook.py) checks it again at each attempt, against what
the name resolves to then (DNS may have changed since the submit), and
connects only to an address it checked.

A destination is refused unless it is http(s), at most MAX_URL characters of
printable ASCII, without credentials, and resolves to a public address; the
setting FUNNEL_WEBHOOK_ALLOW_HOSTS (host names, addresses or networks) lets
private ones through.

A delivery is signed like Stripe's: `Funnel-Signature: t=<unix seconds>,v1=<hex>`,
the HMAC-SHA256 of `<t>.<body>` under FUNNEL_WEBHOOK_SECRET.

A delivery becomes due in the same script that makes its job final
(common/link/lua/webhook_due.lua, included in store_results.lua and cancel.lua); on
a Redis Cluster, where the due set is in another slot, in a step just after it
(common/bulk/jobs.py, mark_due).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

MAX_URL = 2048
SIGNATURE_HEADER = "Funnel-Signature"
ID_HEADER = "Funnel-Webhook-Id"  # the job id: the same on every attempt, for receivers to drop repeats

class Refused(ValueError):
    """A webhook URL that is malformed or points where deliveries may not go."""


@dataclass(frozen=True, kw_only=True)
class Destination:
    scheme: str
    host: str      # the name or address, without brackets
    port: int
    netloc: str    # host[:port] as written: the Host header
    target: str    # path and query: the request target


def parse(url: str) -> Destination:
    if not isinstance(url, str) or not url:
        raise Refused("the webhook must be a URL string")
    if len(url) > MAX_URL:
        raise Refused(f"the webhook URL is longer than {MAX_URL} characters")
    if any(not 0x21 <= ord(c) <= 0x7e for c in url):  # also keeps CR/LF out of the request we write
        raise Refused("the webhook URL must be printable ASCII without spaces (percent-encode the rest)")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused("the webhook URL must be http:// or https://")
    if "@" in parts.netloc:
        raise Refused("the webhook URL may not carry credentials (user:password@)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("the webhook URL has a bad port") from None
    if not parts.hostname:
        raise Refused("the webhook URL has no host")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(scheme=parts.scheme, host=parts.hostname, port=port, netloc=parts.netloc, target=target)


def _networks(allow: list[str]) -> tuple[set[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    names, networks = set(), []
    for entry in allow:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(entry.lower())
    return names, networks


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id is not part of the address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


Resolver = Callable[..., list]


def resolve(dest: Destination, allow: list[str], resolver: Resolver | None = None) -> list[str]:
    """The addresses of the destination a delivery may connect to, in the resolver's order.

    Public addresses, and private ones the allow list names (the host's name, an address, or a
    network); Refused when none is left.
    """
    names, networks = _networks(allow)
    try:
        found = (resolver or socket.getaddrinfo)(dest.host, dest.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"the webhook host {dest.host} does not resolve: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    named = dest.host.lower() in names
    usable = [a for a in addresses if named or is_public(a)
              or any(ipaddress.ip_address(a.split("%", 1)[0]) in net for net in networks)]
    if not usable:
        shown = addresses[0] if addresses else "nothing"
        raise Refused(f"the webhook host {dest.host} resolves to {shown}, a private, loopback or "
                      f"link-local address (FUNNEL_WEBHOOK_ALLOW_HOSTS may allow it)")
    return usable


def check(url: str, allow: list[str], resolver: Resolver | None = None) -> Destination:
    """The destination of a webhook URL that may be delivered to; Refused otherwise."""
    dest = parse(url)
    resolve(dest, allow, resolver)
    return dest


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The Funnel-Signature header's value for this body, sent at `timestamp` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"
