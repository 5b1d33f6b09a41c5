"""`python -m client.stream "text" -o out.wav`: stream speech from Triton over gRPC.

`python -m client.stream --stdin -o out.wav`: text piped in as it is produced (an LLM's output,
typing) goes to the speech API's `WS /v1/audio/speech/stream` (`--api`) as it arrives; the audio
of each utterance (one per line with `--per-line`, else the whole input) is written as it comes.
`--split append` (default: one request that takes the text as it arrives; Qwen3-TTS) or
`sentence` / `clause` / `none`.

A failure prints `error: <code>: ...` (invalid_request / unavailable / internal, as the entry
model's contract) on stderr and exits 1; bad arguments exit 2."""
from __future__ import annotations

import argparse
import json
import sys

from client.triton_stream import TritonStreamError, synthesize
from client.wav import write_wav


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m client.stream", description=__doc__)
    ap.add_argument("text", nargs="?", help="the text (or --stdin)")
    ap.add_argument("--stdin", action="store_true", help="read the text from standard input as it arrives, "
                                                         "through the speech API's WebSocket")
    ap.add_argument("--api", default="http://localhost:8080", help="speech API address (with --stdin)")
    ap.add_argument("--split", default="append", choices=["append", "sentence", "clause", "none"],
                    help="split_granularity (with --stdin)")
    ap.add_argument("--voice", default=None, help="voice (with --stdin; default: the model's)")
    ap.add_argument("--per-line", action="store_true", help="each input line is an utterance (with --stdin)")
    ap.add_argument("-o", "--out", default="out.wav")
    ap.add_argument("--url", default="localhost:8001", help="Triton gRPC address")
    ap.add_argument("--model", default="hibari", help="pipeline (entry model) name")
    ap.add_argument("--params", default=None, help='JSON object, e.g. \'{"speed": 1.2}\'')
    args = ap.parse_args(argv)
    try:
        params = json.loads(args.params) if args.params else None
    except (ValueError, RecursionError) as e:
        ap.error(f"invalid_request: params: --params is not valid JSON ({type(e).__name__}: {e})")
    if args.stdin:
        from client.stdin_speech import speak_stdin

        return speak_stdin(args.api, args.model, args.voice, args.split, params or {}, args.out, args.per_line)
    if args.text is None:
        ap.error("give the text, or --stdin")
    try:
        res = synthesize(args.url, args.model, args.text, params)
    except TritonStreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a client bug still reports a code, not a traceback
        print(f"error: internal: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    write_wav(args.out, res.audio, res.sample_rate)
    print(f"wrote {args.out}: {len(res.chunks)} chunks, {res.audio_s:.2f} s of audio at {res.sample_rate} Hz")
    print(f"time to first audio {res.ttfa_s * 1000:.0f} ms, total {res.total_s * 1000:.0f} ms, "
          f"real-time factor {res.rtf:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
