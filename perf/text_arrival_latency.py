"""How long after a word arrives does its audio start? Text streamed in at an LLM's pace through
`WS /v1/audio/speech/stream`, `append` (one request that takes the text as it arrives) against
`sentence` (vLLM-Omni's approach: a request per complete sentence, reproduced by our own mode), in
one run on one server.

    python perf/text_arrival_latency.py                       # starts its own tritonserver + speech API
    python perf/text_arrival_latency.py --api http://localhost:8080 --rates 20,50

Words are sent one at a time (a word and its space: about one LLM token) at each rate. A listener
plays the audio as it arrives: a unit's audio starts at max(its first byte, the end of the audio
before it). A word's audio starts at its unit's start plus the word's share of the unit's audio (by
characters; no aligner). Reported per mode and rate: delay from a word's arrival to its audio
start (p50 / p95 / max), from the first word to the first audio, and from the last word to the end
of the audio. With the random-weight model the audio is noise whose length is set by
`max_new_tokens` (`--frames-per-word` frames per word, so both modes speak the same length).
"""
from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchkit.repositories import committed_models
from client.speech_stream_client import SpeechStreamClient, ws_url

SENTENCES = [f"This is sentence number {n} of the answer, written by a language model right now."
             for n in ("one", "two", "three", "four", "five", "six")]
RATE = 24000
BYTES_PER_S = RATE * 2


async def measure(api: str, model: str, split: str, rate: float, frames_per_word: int) -> dict:
    text = " ".join(SENTENCES)
    words = re.findall(r"\S+\s*", text)
    per_unit = max(len(re.findall(r"\S+", s)) for s in SENTENCES) if split != "append" else len(words)
    config = {"model": model, "response_format": "pcm", "sample_rate": RATE, "split_granularity": split,
              "max_new_tokens": frames_per_word * per_unit + 1, "sampling": {"do_sample": False, "subtalker_do_sample": False}}
    async with SpeechStreamClient(ws_url(api), config) as session:
        for word in words:
            await session.send_text(word)
            await asyncio.sleep(1.0 / rate)
        last_word = session.sent[-1][0]
        utterance = await session.finish(timeout_s=600)
    # units: (text, first audio byte time, audio bytes)
    units, current = [], None
    for r in utterance.received:
        kind = r.message.get("type") if r.message else None
        if kind == "audio.start":
            current = {"text": r.message["sentence_text"], "first": None, "bytes": 0}
            units.append(current)
        elif kind == "audio.done" and r.message.get("sentence_text"):
            current["text"] = r.message["sentence_text"]
        if r.audio and current is not None:
            current["first"] = current["first"] or r.at
            current["bytes"] += len(r.audio)
    # the listener's timeline, and each word's start in it
    delays, end, position = [], 0.0, 0
    sent = session.sent
    for unit in units:
        if unit["first"] is None:
            continue
        start = max(unit["first"], end)
        duration = unit["bytes"] / BYTES_PER_S
        unit_words = re.findall(r"\S+\s*", unit["text"])
        chars, total = 0, max(1, sum(len(w) for w in unit_words))
        for w in unit_words:
            arrived = sent[position][0]
            delays.append(start + duration * chars / total - arrived)
            chars += len(w)
            position += 1
        end = start + duration
    delays.sort()
    first_audio = min(u["first"] for u in units if u["first"] is not None)
    return {"mode": split, "rate": rate, "words": len(words), "p50_ms": 1000 * statistics.median(delays),
            "p95_ms": 1000 * delays[int(0.95 * (len(delays) - 1))], "max_ms": 1000 * delays[-1],
            "first_audio_ms": 1000 * (first_audio - sent[0][0]), "tail_ms": 1000 * (end - last_word),
            "errors": len(utterance.errors)}


def start_stack(model: str):
    from client.speech_api.process import ShimProcess
    from client.triton_process import TritonProcess

    tmp = Path(tempfile.mkdtemp(prefix="text-latency-"))
    repo = committed_models(tmp / "model_repository", (model, f"{model}__talker", f"{model}__code2wav"))
    triton = TritonProcess(repo, log_path=tmp / "tritonserver.log").start(timeout_s=600)
    shim = ShimProcess([triton.grpc_url], log_path=tmp / "shim.log").start(timeout_s=120)
    return triton, shim


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", default=None, help="a running speech API (default: start tritonserver + API here)")
    ap.add_argument("--model", default="qwen3_tts_tiny_random")
    ap.add_argument("--rates", default="20,50", help="words (about LLM tokens) per second, comma separated")
    ap.add_argument("--frames-per-word", type=int, default=4, help="audio frames (80 ms) per word")
    args = ap.parse_args(argv)
    stack = None
    api = args.api
    if api is None:
        stack = start_stack(args.model)
        api = stack[1].url
    try:
        rows = []
        for rate in (float(r) for r in args.rates.split(",")):
            for split in ("append", "sentence"):
                rows.append(asyncio.run(measure(api, args.model, split, rate, args.frames_per_word)))
        print("| mode | words/s | words | word -> its audio p50 (ms) | p95 | max | first word -> first audio (ms) "
              "| last word -> end of audio (ms) | errors |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['mode']} | {r['rate']:g} | {r['words']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
                  f"{r['max_ms']:.0f} | {r['first_audio_ms']:.0f} | {r['tail_ms']:.0f} | {r['errors']} |")
    finally:
        if stack is not None:
            stack[1].stop()
            stack[0].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
