"""The supervisor passes tritonserver's output on and spots the line its crash handler writes."""
from __future__ import annotations

import asyncio
import io
import sys

from omni_backend.supervisor import server_output

CHILD = r'''
import sys, time
for piece in sys.argv[1:]:
    sys.stdout.buffer.write(piece.encode().decode("unicode_escape").encode())
    sys.stdout.flush()
    time.sleep(0.05)
'''


def run(*pieces: str) -> tuple[bytes, list[bytes]]:
    async def scenario() -> tuple[bytes, list[bytes]]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, *pieces,
                                                    stdout=asyncio.subprocess.PIPE)
        out, seen = io.BytesIO(), []
        await server_output.forward(proc.stdout, seen.append, out)
        await proc.wait()
        return out.getvalue(), seen

    return asyncio.run(scenario())


def test_a_crash_line_split_across_reads_is_seen_once_and_everything_passes_on():
    out, seen = run("I1202 serving\\n", "Signal (6) rec", "eived.\\n", " 0# 0x1 in tritonserver\\n",
                    "Signal (11) received.\\n")
    assert seen == [b"Signal (6) received."]
    assert out == (b"I1202 serving\nSignal (6) received.\n 0# 0x1 in tritonserver\n"
                   b"Signal (11) received.\n")


def test_a_normal_stop_and_other_output_are_not_crashes():
    out, seen = run("Signal (15) received.\\n", "Signal (2) received.\\n", "no Signal (6) here\\n")
    assert seen == []
    assert out.endswith(b"no Signal (6) here\n")


def test_loading_follows_the_models_the_log_says_are_still_loading():
    loading = server_output.Loading()
    loading.feed(b'I1203 18:42:58.309 5866 model_lifecycle.cc:472] "loading: hibari:1"\n'
                 b'I1203 18:42:58.309 5866 model_lifecycle.cc:472] "loading: qwen3_tts__code2')
    assert loading.pending == ["hibari"]   # the second line is not whole yet
    loading.feed(b'wav:1"\nI1203 model_lifecycle.cc:472] "loading: orpheus__lm:2"\n'
                 b'''I1203 model_lifecycle.cc:839] "successfully loaded 'hibari'"\n''')
    assert loading.pending == ["qwen3_tts__code2wav", "orpheus__lm"]
    loading.feed(b'''E1203 model_lifecycle.cc:641] "failed to load 'orpheus__lm' version 2: Internal: boom"\n''')
    loading.feed(b'''I1203 omni: a stub printed "successfully loaded" but named nothing\n''')
    assert loading.pending == ["qwen3_tts__code2wav"]
