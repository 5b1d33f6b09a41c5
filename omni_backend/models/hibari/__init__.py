"""The English voice that ships inside the hibari-tts wheel (24 kHz, one chunk per sentence).

Memory: a sentence's synthesis needs tens of MB (about 90 MB of numpy buffers alone for 44 s of
audio), all of it freed when the sentence is done. What stays resident is decided by the
allocators that cache freed memory: onnxruntime's CPU arena (it keeps the peak of all concurrent
runs and never shrinks), glibc's per-thread heaps (one per thread that ever synthesised, each
keeping its own high-water mark) and glibc's mmap threshold (raised to 32 MiB after the first
large free, so big buffers land in those heaps too). Unbounded, that resident set grew with every
new peak of (concurrent syntheses x sentence length): 201 -> 1,237 MB over 640 requests of 16
streams on 16 threads, in-process. So the voice runs its session without the arena and
synthesises on its own `max_concurrent` threads, and a process that synthesises calls
`omni_backend.glibc_heaps.bound_malloc_retention()` first (which also stops numpy asking for huge
pages for its audio-sized arrays, which the kernel filled 2 MiB at a time in the heaps while the
server was idle); tests/unit/test_hibari_memory.py holds it.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from omni_backend.glibc_heaps import release_free_memory

from .text_chunks import phoneme_chunks

SAMPLE_RATE = 24000


def _uncache_overlap_add_norm() -> None:
    """The wheel's inverse STFT keeps its normalisation array for the last 8 sentence lengths
    (`hibari.dsp._ola_norm`, an lru_cache): 4-10 MB of audio-sized arrays that outlive their
    sentences, pin the heap pages around them against the trim, and move the resident floor
    by as much as the lengths of the last sentences vary (8 rounds of 16 varied streams: 4.5-7 MB
    more kept with it). Recomputing it costs 3.5 ms for a 12 s sentence."""
    from hibari import dsp

    cached = getattr(dsp, "_ola_norm", None)   # a private name: a later wheel may not have it
    if cached is not None:
        dsp._ola_norm = getattr(cached, "__wrapped__", cached)


class HibariVoice:
    """Loads the bundled voice once; `stream()` yields one float32 array per sentence (or part of a long one).

    Audio for a given (text, speed, seed) is identical whether streamed or synthesized at once:
    one noise generator runs across the sentences of a request.

    `executor` is where callers run `next()` on a stream: its `max_concurrent` threads are the
    only ones that synthesise, so at most that many sentences are in memory at once and only
    that many glibc heaps ever hold synthesis buffers.
    """

    def __init__(self, threads: int = 1, max_concurrent: int = 8):
        import onnxruntime as ort
        from hibari import Hibari
        from hibari.voices import VOICES

        if not VOICES["heart"].get("bundled"):
            raise RuntimeError("hibari-tts no longer bundles the 'heart' voice")
        self.tts = Hibari(voice="heart", threads=threads)
        _uncache_overlap_add_norm()
        # The wheel's session keeps onnxruntime's CPU arena: every run's activations stay
        # allocated at the peak of all concurrent runs. Without it they go back to malloc when
        # a run ends; the arena saved no measurable time here.
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = False
        self.tts.sess = ort.InferenceSession(self.tts.model_path, options, providers=["CPUExecutionProvider"])
        self.executor = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="hibari-synth")
        self.tts("Warm up.", seed=0)  # loads the G2P and the ONNX session's kernels

    def stream(self, text: str, voice: str = "heart", speed: float = 1.0, seed: int = 0) -> Iterator[np.ndarray]:
        """One float32 array per chunk (a sentence, or a part of a long one: `text_chunks`); the
        wheel's `stream` would phonemize the whole text first and leave long chunks unbounded."""
        rng = np.random.default_rng(seed)
        for phonemes in phoneme_chunks(self.tts, text):
            audio = self.tts.from_ids(self.tts.ids(phonemes), speed, rng)
            release_free_memory()   # the chunk's buffers are free now: return them, not keep them
            yield audio

    def synthesize(self, text: str, speed: float = 1.0, seed: int = 0) -> np.ndarray:
        parts = list(self.stream(text, speed=speed, seed=seed))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
