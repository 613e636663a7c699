"""The test and bench stacks' ports: free, and out of the range outgoing connections take theirs from."""

from __future__ import annotations

import socket
from pathlib import Path

from funnel.scripts.redis_local import CLUSTER_BUS_OFFSET, cluster_port, free_port


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_free_port_is_bindable_and_below_the_ephemeral_range_with_its_bus():
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # chosen at random: two stacks started at once rarely meet
    for port in ports:
        assert port + CLUSTER_BUS_OFFSET < ephemeral_low()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_cluster_port_has_its_bus_port_free_too():
    port = cluster_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
