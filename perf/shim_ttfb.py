"""Time to first byte of the OpenAI speech shim, per response format and concurrency.

    python perf/shim_ttfb.py                      # starts tritonserver (hibari only) + the shim
    python perf/shim_ttfb.py --shim http://localhost:8080 --model tts-1
    python perf/shim_ttfb.py --triton localhost:8001 --concurrency 1 4 8 --rounds 5

Each worker sends `--rounds` requests one after another; `--concurrency N` runs N workers at
once. Time to first byte (ttfb) is from sending the request to the first body byte; `status` is
to the status line (the shim sends it when the first audio is ready), `total` to the last byte.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx


from benchkit.percentiles import percentile
from benchkit.repositories import committed_models
from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess

FORMATS = ["pcm", "wav", "mp3", "opus", "aac", "flac", "sse"]
TEXT = "The quick brown fox jumps over the lazy dog. Then it runs back home before the rain starts."


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
        status_s = time.perf_counter() - t0
        first = None
        size = 0
        async for chunk in response.aiter_raw():
            if chunk and first is None:
                first = time.perf_counter() - t0
            size += len(chunk)
        return {"code": response.status_code, "status": status_s, "ttfb": first if first is not None else float("nan"),
                "total": time.perf_counter() - t0, "bytes": size}


async def run_level(url: str, body: dict, concurrency: int, rounds: int, headers: dict) -> list[dict]:
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits, headers=headers) as client:
        async def worker() -> list[dict]:
            return [await one_request(client, url, body) for _ in range(rounds)]
        results = await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for rs in results for r in rs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", help="URL of a running shim (default: start one)")
    ap.add_argument("--triton", action="append", help="Triton gRPC URL for the shim this script starts "
                                                      "(default: start tritonserver with hibari only)")
    ap.add_argument("--model", default="hibari")
    ap.add_argument("--voice", default="alloy")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--rounds", type=int, default=6, help="requests per worker (default 6)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests per format first")
    ap.add_argument("--api-key", help="Bearer key for a shim that needs one")
    args = ap.parse_args(argv)

    stack = []
    try:
        url = args.shim
        if url is None:
            tritons = args.triton
            if not tritons:
                repo = committed_models(Path(tempfile.mkdtemp(prefix="shim-ttfb-")) / "model_repository",
                                        ("hibari", "hibari__synthesizer"))
                server = TritonProcess(repo, log_path=repo.parent / "tritonserver.log")
                t0 = time.perf_counter()
                server.start()
                stack.append(server)
                print(f"tritonserver (hibari) ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                tritons = [server.grpc_url]
            shim = ShimProcess(tritons, log_path=Path(tempfile.mkdtemp(prefix="shim-ttfb-")) / "shim.log")
            shim.start()
            stack.append(shim)
            url = shim.url
        headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}

        rows = []
        for fmt in args.formats:
            body = {"model": args.model, "voice": args.voice, "input": args.text,
                    "response_format": "pcm" if fmt == "sse" else fmt}
            if fmt == "sse":
                body["stream_format"] = "sse"
            asyncio.run(run_level(url, body, 1, args.warmup, headers))
            for c in args.concurrency:
                results = asyncio.run(run_level(url, body, c, args.rounds, headers))
                ok = [r for r in results if r["code"] == 200]
                ttfb = [r["ttfb"] * 1000 for r in ok]
                rows.append((fmt, c, len(results), len(results) - len(ok),
                             percentile(ttfb, 50), percentile(ttfb, 90), max(ttfb) if ttfb else float("nan"),
                             statistics.median(r["status"] * 1000 for r in ok) if ok else float("nan"),
                             statistics.median(r["total"] * 1000 for r in ok) if ok else float("nan"),
                             statistics.median(r["bytes"] for r in ok) if ok else 0))
        print(f"\nshim {url}, model {args.model}, text of {len(args.text)} characters\n")
        head = ("format", "conc", "n", "errors", "ttfb p50 ms", "ttfb p90 ms", "ttfb max ms",
                "status p50 ms", "total p50 ms", "bytes")
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for fmt, c, n, errors, p50, p90, mx, st, total, size in rows:
            print(f"| {fmt} | {c} | {n} | {errors} | {p50:.0f} | {p90:.0f} | {mx:.0f} | {st:.0f} | {total:.0f} | {size:.0f} |")
        return 0
    finally:
        for part in reversed(stack):
            part.stop()


if __name__ == "__main__":
    sys.exit(main())
