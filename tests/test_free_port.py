"""The port a test server (or the embedded PostgreSQL) will listen on is one no connection takes."""

from __future__ import annotations

import socket
from pathlib import Path

from shoal.db.embedded import free_port


def test_a_free_port_lies_below_the_range_outgoing_connections_take() -> None:
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    first = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    ports = [free_port() for _ in range(20)]
    assert all(1024 < p < first for p in ports), ports
    assert len(set(ports)) == 20  # never the same port twice in one process
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # and free to listen on
