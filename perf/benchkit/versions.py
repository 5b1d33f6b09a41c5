"""The versions a result names, so a figure can be compared with a later one."""
from __future__ import annotations

import os
import platform


def server_version(url: str) -> str:
    """The Triton server's version, from its gRPC metadata."""
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url).get_server_metadata().version


def versions(triton: str) -> str:
    import torch

    return f"Python {platform.python_version()}, torch {torch.__version__}, Triton server {triton}"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs"
