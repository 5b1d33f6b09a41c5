"""What one request leaves in the speech API's memory, by response format and by how it ends.

    .venv/bin/python perf/speech_api_memory.py [--requests 120] [--clients 8]

Starts a tritonserver on a hibari-only repository and the speech API in front of it, warms both
up, then sends rounds of POST /v1/audio/speech (`--clients` at a time) and prints, per round, the
growth of the speech API's anonymous memory (RssAnon) per request: whole responses in each format,
and hang-ups after the first body bytes. Each figure is read after the speech API's periodic trim
(free heap pages go back to the OS), so what it shows is memory still held. Not a test: the figures
depend on the allocator and the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx


from benchkit.memory import status_kb
from benchkit.repositories import committed_models
from benchkit.speech_api import http_request
from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess
from omni_backend.glibc_heaps import TRIM_INTERVAL_S

TEXT = "Memory per request, measured. A second sentence follows it."
FORMATS = ("pcm", "wav", "mp3", "opus", "flac", "aac")


async def rounds(shim: ShimProcess, n: int, clients: int) -> None:
    def anon_mb() -> float:
        return status_kb(shim.proc.pid).get("RssAnon", 0) / 1024

    async def settled() -> float:
        # the lowest value over one trim interval: what is free has gone back by then
        low, end = anon_mb(), time.monotonic() + TRIM_INTERVAL_S + 2
        while time.monotonic() < end:
            await asyncio.sleep(1)
            low = min(low, anon_mb())
        return low

    async with httpx.AsyncClient(timeout=120) as http:
        async def run(body: dict, hang_up: bool) -> None:
            queue = list(range(n))

            async def worker() -> None:
                while queue:
                    queue.pop()
                    await http_request(http, shim.url, body, hang_up)
            await asyncio.gather(*(worker() for _ in range(clients)))

        plan = [("warm-up (every format)", None, False)] + [
            (f"whole, {f}", f, False) for f in FORMATS] + [("hang-up, wav", "wav", True), ("hang-up, mp3", "mp3", True)]
        print(f"{'round':<24} {'requests':>8} {'s':>6} {'anon MB':>16} {'KB/request':>10}", flush=True)
        before = await settled()
        for name, fmt, hang_up in plan:
            t0 = time.monotonic()
            for f in ([fmt] if fmt else FORMATS):
                await run({"model": "hibari", "input": TEXT, "voice": "alloy", "response_format": f}, hang_up)
            spent = time.monotonic() - t0
            after = await settled()
            count = n * (1 if fmt else len(FORMATS))
            print(f"{name:<24} {count:>8} {spent:>6.1f} {f'{before:.1f} -> {after:.1f}':>16} "
                  f"{(after - before) * 1024 / count:>10.2f}", flush=True)
            before = after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=120, help="requests per round")
    ap.add_argument("--clients", type=int, default=8, help="requests at a time")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="omni-speech-api-memory-") as tmp:
        repo = committed_models(Path(tmp) / "model_repository", ("hibari", "hibari__synthesizer"))
        server = TritonProcess(repo, log_path=Path(tmp) / "tritonserver.log",
                               extra_args=["--supervisor-heal=false"]).start()
        try:
            shim = ShimProcess([server.grpc_url], log_path=Path(tmp) / "speech_api.log").start()
            try:
                asyncio.run(rounds(shim, args.requests, args.clients))
            finally:
                shim.stop()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
