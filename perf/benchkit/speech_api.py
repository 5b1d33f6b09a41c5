"""One POST /v1/audio/speech, timed to its first body byte (the speech API sends its status line
when the first audio is ready)."""
from __future__ import annotations

import time

import httpx

from client.triton_stream import TritonStreamError


async def http_request(http: httpx.AsyncClient, url: str, body: dict, hang_up: bool) -> float | None:
    """Seconds to the first body byte (None without one); `hang_up` closes the connection there.
    A status other than 200 raises TritonStreamError coded `http_<status>`."""
    t0 = time.perf_counter()
    ttfa = None
    async with http.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:200]
            raise TritonStreamError(f"http_{response.status_code}: {detail}")
        async for chunk in response.aiter_raw():
            if chunk and ttfa is None:
                ttfa = time.perf_counter() - t0
                if hang_up:
                    break   # leaving the block closes the connection mid-body
    return ttfa
