"""Triton pods found through one DNS name (a Kubernetes headless Service).

A headless Service's name resolves to one address per ready pod (the kubelet takes a pod out
while its readiness probe fails, and once it is terminating), so the set of Tritons behind the
speech API follows the cluster without a list of URLs. The name is resolved by the system's
resolver (`getaddrinfo`: /etc/hosts, then DNS), like any client in the pod would, every
`resolve_interval_s`; each address with the Service's gRPC port is one endpoint of the pool.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class TritonService:
    """`NAME:PORT`: a DNS name whose addresses are Triton pods, and their gRPC port."""
    host: str
    port: int

    @classmethod
    def parse(cls, spec: str, flag: str = "--triton-service") -> "TritonService":
        host, sep, port = spec.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: expected NAME:PORT (a DNS name and the pods' gRPC port), got {spec!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    async def addresses(self) -> list[str]:
        """`ip:port` of every address the name resolves to now, sorted; raises OSError when the
        name does not resolve."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        return sorted({grpc_address(info[4][0], self.port) for info in infos})


def grpc_address(ip: str, port: int) -> str:
    """The target gRPC takes for one address (IPv6 in brackets)."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"
