"""The hibari voice's resident memory stays bounded under many concurrent, varied streams.

Measured in a fresh interpreter (RSS of the pytest process depends on every test before this
one): 16 streams of two long sentences at slow speeds (the largest buffers), a quarter of them
abandoned after the first sentence, run the way the stage runs them (one `next()` per sentence
on the voice's executor). Before the voice bounded its memory the first round alone left
+1,167 MB resident (16 threads, onnxruntime's arena, glibc's raised mmap threshold and a heap per
thread); with bounded heaps +134 to +186 MB over five rounds; trimming the heaps after each
sentence, within 5 MB.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# memory soaks of a minute and more: not the edit-test loop (tests/tiers.py)
pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, random
from omni_backend.glibc_heaps import bound_malloc_retention
from omni_backend.models.hibari import HibariVoice

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

bound_malloc_retention()
voice = HibariVoice(max_concurrent=4)
words = "the quick brown fox jumps over a lazy dog while she sells sea shells by the shore".split()
rng = random.Random(0)
base = rss_mb()
growth = []
for _ in range(ROUNDS):
    streams = []
    for i in range(16):
        text = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(15, 30))) + "."
                        for _ in range(2))
        streams.append((voice.stream(text, speed=rng.uniform(0.5, 0.8), seed=i), i % 4 == 0))
    pending = [(s, abandon, voice.executor.submit(next, s, None)) for s, abandon in streams]
    while pending:
        later = []
        for s, abandon, job in pending:
            if job.result() is None or abandon:
                s.close()
            else:
                later.append((s, abandon, voice.executor.submit(next, s, None)))
        pending = later
    growth.append(rss_mb() - base)
print(json.dumps(growth))
"""


def run_rounds(rounds: int) -> list[float]:
    done = subprocess.run([sys.executable, "-c", SCRIPT.replace("ROUNDS", str(rounds))], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_resident_memory_is_bounded_over_varied_concurrent_streams():
    growth = run_rounds(3)
    # what a sentence needs is given back after it: nothing settles, nothing creeps
    assert max(growth) < 50, growth
    assert growth[-1] - growth[0] < 25, growth


def test_voice_session_keeps_no_arena_same_audio_and_bounded_threads():
    from omni_backend.models.hibari import HibariVoice

    voice = HibariVoice(max_concurrent=3)
    try:
        assert voice.tts.sess.get_session_options().enable_cpu_mem_arena is False
        assert voice.executor._max_workers == 3
        # the session built without the arena speaks exactly as the wheel's own
        from hibari import Hibari

        text = "Memory stays bounded. Twice."
        assert (voice.synthesize(text, seed=3) == Hibari(voice="heart")(text, seed=3)).all()
    finally:
        voice.close()


def test_no_audio_sized_buffer_outlives_its_sentence():
    import gc
    import tracemalloc

    from omni_backend.models.hibari import HibariVoice

    voice = HibariVoice(max_concurrent=1)
    try:
        voice.synthesize("Once more to warm up.", seed=0)
        tracemalloc.start()
        try:
            # eight sentence lengths, as many as the wheel's inverse STFT used to keep
            for n in range(8):
                voice.synthesize(" ".join(["seven"] * (6 + 4 * n)) + ".", seed=n)
            gc.collect()
            kept, _ = tracemalloc.get_traced_memory()   # numpy reports its buffers here too
        finally:
            tracemalloc.stop()
        assert kept < 1 << 20, f"{kept / 2**20:.1f} MB still allocated after the sentences"
    finally:
        voice.close()
