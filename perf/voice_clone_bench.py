"""Voice cloning costs (printed as tables; not a timed test).

    .venv/bin/python perf/voice_clone_bench.py [--threads 1] [--served]

1. Encoding one reference recording (hibari speech, ~5.6 s at 24 kHz) into a voice-clone prompt:
   in-context mode (Mimi encoder -> 16 x codes, plus the ECAPA-TDNN x-vector) and x-vector-only
   mode, on the tiny random Base checkpoint and on the released encoder shapes (random weights:
   the cost does not depend on the values).
2. ``--served``: time to first audio through tritonserver (the committed model_repository) for a
   built-in speaker (qwen3_tts_tiny_random) against a cloned voice (qwen3_tts_tiny_random_base),
   with the voice already encoded (cached) and on its first use (encoded in the request).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchkit.paths import MODEL_REPOSITORY

# what the reference recordings say (hibari speaks them)
VOICE_TEXTS = [
    "Hello there, this is a short reference recording of my voice.",
    "Good morning, everyone. I hope the trains run on time today.",
    "The weather is lovely, so we will walk to the park after lunch.",
    "Please leave a message after the tone, and I will call you back.",
]


def wav_data_url(audio, rate: int = 24000) -> str:
    """A recording as the data URL a request's `ref_audio` takes."""
    import base64
    import io

    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()


def _timed(fn, repeat: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1000.0


def encoding(threads: int) -> None:
    import torch

    from hibari import Hibari
    from omni_backend.models.qwen3_tts.random_checkpoint import checkpoint_config, write_random_checkpoint
    from omni_backend.models.qwen3_tts.config import Qwen3TTSConfig
    from omni_backend.models.qwen3_tts.speaker_encoder import SpeakerEncoder
    from omni_backend.models.qwen3_tts.speech_encoder import SpeechEncoder
    from omni_backend.models.qwen3_tts.random_speech_tokenizer import write_speech_tokenizer
    from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder

    torch.set_num_threads(threads)
    audio = Hibari()("Hello there, this is a short reference recording of my voice, about five seconds long.",
                     seed=0)
    work = tempfile.mkdtemp(prefix="voice-bench-")
    tiny = write_random_checkpoint(os.path.join(work, "tiny"), "tiny", "base", 0)
    encoder = VoiceEncoder.from_checkpoint(tiny, dict(Qwen3TTSConfig.from_dict(checkpoint_config("tiny", "base")).speaker_encoder))
    rows = [("tiny", "in-context (codes + x-vector)", _timed(lambda: encoder.encode(audio, 24000, "x"), 5)),
            ("tiny", "x-vector only", _timed(lambda: encoder.encode(audio, 24000, None, True), 5))]
    write_speech_tokenizer(os.path.join(work, "real_st"), "0.6b", 0)
    mimi = SpeechEncoder.from_checkpoint(os.path.join(work, "real_st"))
    rows.append(("released shape", "Mimi encoder (codes)", _timed(lambda: mimi.encode(audio), 3)))
    for size in ("0.6b", "1.7b"):
        ecapa = SpeakerEncoder(Qwen3TTSConfig.from_dict(checkpoint_config(size, "base")).speaker_encoder).eval()
        rows.append((f"released shape {size}", "ECAPA-TDNN (x-vector)", _timed(lambda: ecapa.embed(audio), 3)))
    print(f"\nEncoding a {len(audio) / 24000:.1f} s reference, {threads} thread(s):\n")
    print("| checkpoint | part | ms |\n|---|---|---|")
    for shape, part, ms in rows:
        print(f"| {shape} | {part} | {ms:.1f} |")


def served(n: int = 10) -> None:
    os.environ.setdefault("OMNI_CACHE_DIR", tempfile.mkdtemp(prefix="voice-bench-cache-"))
    from client.triton_process import TritonProcess
    from client.triton_stream import synthesize
    from hibari import Hibari

    server = TritonProcess(MODEL_REPOSITORY, log_path=Path(tempfile.mkdtemp()) / "tritonserver.log")
    server.start()
    try:
        greedy = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": 12}
        voice = Hibari()
        recordings = [voice(VOICE_TEXTS[i % 4] + " And more." * (i // 4), seed=i) for i in range(n + 2)]
        text = "Hello there, how are you today?"

        def ttfa(model, params):
            return synthesize(server.grpc_url, model, text, params).ttfa_s * 1000.0

        ttfa("qwen3_tts_tiny_random", {**greedy, "voice": "ryan"})
        ttfa("qwen3_tts_tiny_random_base", {**greedy, "ref_audio": wav_data_url(recordings[-1]), "ref_text": "x"})
        cached = {"ref_audio": wav_data_url(recordings[0]), "ref_text": VOICE_TEXTS[0]}
        rows = {
            "built-in speaker (ryan)": [ttfa("qwen3_tts_tiny_random", {**greedy, "voice": "ryan"}) for _ in range(n)],
            "clone, in-context, cached": [ttfa("qwen3_tts_tiny_random_base", {**greedy, **cached}) for _ in range(n)],
            "clone, x-vector only, cached": [ttfa("qwen3_tts_tiny_random_base",
                                                  {**greedy, "ref_audio": cached["ref_audio"], "x_vector_only_mode": True})
                                             for _ in range(n)],
            "clone, in-context, first use": [ttfa("qwen3_tts_tiny_random_base",
                                                  {**greedy, "ref_audio": wav_data_url(recordings[i]),
                                                   "ref_text": VOICE_TEXTS[i % 4]}) for i in range(1, n + 1)],
        }
        print(f"\nServed time to first audio (tiny random checkpoints, c=1, {n} requests each):\n")
        print("| request | median ms | min | max |\n|---|---|---|---|")
        for name, values in rows.items():
            print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--served", action="store_true")
    args = parser.parse_args()
    encoding(args.threads)
    if args.served:
        served()
    return 0


if __name__ == "__main__":
    sys.exit(main())
