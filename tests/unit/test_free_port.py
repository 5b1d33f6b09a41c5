"""Ports for the servers the project starts: free, outside the kernel's ephemeral range (where an
outgoing connection could take one before the server binds it), never the same twice."""
from __future__ import annotations

import socket

from client.service_process import _ephemeral_range, free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(p < low for p in ports), [p for p in ports if p >= low][:5]
    for port in ports[:20]:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))   # free: a server can bind it
