"""`python -m client.stream --stdin`: speak standard input while it is still being written.

Bytes are read as they arrive (not line by line: an LLM piped in writes word by word), decoded
incrementally as UTF-8 and sent as `input.text`; end of input (or, with `per_line`, each newline)
is `input.done`. Audio comes back as PCM while the text is still arriving and is written to a WAV
file at the end; the time from the first text to the first audio is printed.
"""
from __future__ import annotations

import asyncio
import codecs
import os
import sys
import time
from typing import Any

import numpy as np

from client.speech_stream_client import SpeechStreamClient, ws_url
from client.wav import write_wav

RATE = 24000


async def _speak(api: str, config: dict[str, Any], out: str, per_line: bool) -> int:
    loop = asyncio.get_running_loop()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = sys.stdin.fileno()
    audio: list[bytes] = []
    first_text = first_audio = None
    errors: list[dict] = []
    async with SpeechStreamClient(ws_url(api), config) as session:
        pending_done = False
        while True:
            data = await loop.run_in_executor(None, os.read, fd, 4096)
            text = decoder.decode(data, final=not data)
            pieces = text.split("\n") if per_line else [text]
            for i, piece in enumerate(pieces):
                if piece:
                    first_text = first_text or time.perf_counter()
                    await session.send_text(piece)
                    pending_done = True
                if per_line and i < len(pieces) - 1 and pending_done:
                    utterance = await session.finish()
                    audio.append(utterance.audio)
                    errors += utterance.errors
                    pending_done = False
            if not data:
                break
        if pending_done:
            utterance = await session.finish()
            audio.append(utterance.audio)
            errors += utterance.errors
        first_audio = next((r.at for r in session.received if r.audio), None)
        await session.close_session()
    for error in errors:
        print(f"error: {error.get('message')}", file=sys.stderr)
    samples = np.frombuffer(b"".join(audio), "<i2").astype(np.float32) / 32768.0
    write_wav(out, samples, RATE)
    print(f"wrote {out}: {samples.size / RATE:.2f} s of audio at {RATE} Hz")
    if first_text is not None and first_audio is not None:
        print(f"first audio {1000 * (first_audio - first_text):.0f} ms after the first text")
    return 1 if errors else 0


def speak_stdin(api: str, model: str, voice: str | None, split: str, params: dict[str, Any], out: str,
                per_line: bool = False) -> int:
    config = {"model": model, "response_format": "pcm", "sample_rate": RATE, "split_granularity": split, **params}
    if voice:
        config["voice"] = voice
    try:
        return asyncio.run(_speak(api, config, out, per_line))
    except (OSError, ConnectionError, TimeoutError) as e:
        print(f"error: unavailable: {api}: {e}", file=sys.stderr)
        return 1
