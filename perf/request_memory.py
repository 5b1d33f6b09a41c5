"""What one request leaves in tritonserver's heap, by how its gRPC stream ends.

    .venv/bin/python perf/request_memory.py [--requests 200]

Starts a tritonserver on a hibari-only repository (no supervisor pings, so nothing else runs),
warms it up, then sends rounds of requests one after another and prints, per round, the growth of
tritonserver's anonymous memory (RssAnon) per request: whole requests through `client.triton_stream`
(the stream left for Triton to end after the final response), the same with the stream cancelled
after the final response (what the clients did before), and hang-ups after the first audio, ended
by a cancel request to the entry (what `client.triton_stream` does with a stream id of its own)
or by cancelling the gRPC stream (with a caller's id, which may repeat). Not a test: the figures
depend on the allocator and the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from benchkit.memory import status_kb
from benchkit.repositories import committed_models
from client.triton_process import TritonProcess
from client.triton_stream import EMPTY_FINAL, _inputs, astream

ONE = "Memory per request, measured."
FOUR = "One sentence here. Another one there. A third one follows. And the last one ends it."


async def rounds(server: TritonProcess, n: int) -> None:
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(server.grpc_url)

    async def whole() -> None:
        async for _ in astream(client, "hibari", ONE):
            pass

    async def cancelled_after_final() -> None:
        async def requests():
            yield {"model_name": "hibari", "inputs": _inputs(aioclient, ONE, None),
                   "parameters": EMPTY_FINAL}
        responses = client.stream_infer(inputs_iterator=requests())
        try:
            async for result, error in responses:
                if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                    break
        finally:
            responses.cancel()

    async def hang_up(request_id: str = "") -> None:
        # no id: `astream` makes a unique one and ends the stream by a cancel request to the entry
        stream = astream(client, "hibari", FOUR, None, request_id)
        async for _ in stream:
            break
        await stream.aclose()

    async def hang_up_cancelled() -> None:
        await hang_up("caller-given-id")   # an id that may repeat: the gRPC stream is cancelled

    def anon_kb() -> int:
        return status_kb(server.server_pid).get("RssAnon", 0)

    print(f"{'round':<36} {'requests':>8} {'s':>6} {'anon MB':>16} {'KB/request':>10}")
    plan = [("warm-up (whole)", whole)] + [
        ("whole, Triton ends the stream", whole), ("whole, cancelled after the final", cancelled_after_final),
        ("hang-up, ended by a cancel request", hang_up),
        ("hang-up, gRPC stream cancelled", hang_up_cancelled)] * 2
    for name, one in plan:
        a0, t0 = anon_kb(), time.monotonic()
        for _ in range(n):
            await one()
        await asyncio.sleep(2)
        a1 = anon_kb()
        print(f"{name:<36} {n:>8} {time.monotonic() - t0:>6.1f} {f'{a0 / 1024:.1f} -> {a1 / 1024:.1f}':>16} "
              f"{(a1 - a0) / n:>10.2f}", flush=True)
    await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests per round")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="omni-request-memory-") as tmp:
        repo = committed_models(Path(tmp) / "model_repository", ("hibari", "hibari__synthesizer"))
        server = TritonProcess(repo, log_path=Path(tmp) / "tritonserver.log",
                               extra_args=["--supervisor-heal=false"]).start()
        try:
            asyncio.run(rounds(server, args.requests))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
