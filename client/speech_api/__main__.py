"""`python -m client.speech_api --triton localhost:8001 [--triton URL ...]
[--triton-service NAME:PORT ...]`: the OpenAI-compatible speech API in front of one or more
Triton servers, listed or found through a DNS name (a Kubernetes headless Service)."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from client.speech_api.auth import ENV_VAR, load_api_keys
from client.speech_api.catalog import parse_model_names
from client.speech_api.config import ShimConfig, StreamLimits
from client.speech_api.discovery import TritonService

# An idle connection closed by the server just as its client sends the next request on it fails
# that request (the client sees the connection cut). Clients close theirs first when the server
# waits longer than they do (httpx 5 s, aiohttp 15 s); uvicorn's own default is 5 s.
KEEP_ALIVE_S = 75


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m client.speech_api", description=__doc__)
    ap.add_argument("--triton", action="append", metavar="URL",
                    help="Triton gRPC address host:port; repeat for several servers (default localhost:8001, "
                         "unless --triton-service is given)")
    ap.add_argument("--triton-service", action="append", metavar="NAME:PORT",
                    help="a DNS name resolving to one address per Triton (a Kubernetes headless Service) "
                         "and their gRPC port; every address is a Triton; repeatable")
    ap.add_argument("--resolve-interval", type=float, default=5.0, metavar="SECONDS",
                    help="how often --triton-service names are resolved again (default 5)")
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    ap.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    ap.add_argument("--api-key", action="append", metavar="KEY",
                    help=f"require Authorization: Bearer KEY on /v1/*; repeatable; also ${ENV_VAR} (comma separated)")
    ap.add_argument("--max-streams-per-pipeline", type=int, default=0, metavar="N",
                    help="concurrent streams per pipeline before 429 (default 0: no shim limit)")
    ap.add_argument("--default-pipeline", default=None,
                    help="pipeline behind tts-1, tts-1-hd and gpt-4o-mini-tts (default: the built-in "
                         "pipeline declared openai_default, the embedded English voice)")
    ap.add_argument("--served-model-name", action="append", default=[], metavar="NAME=PIPELINE",
                    help="another name a request's model may give a pipeline (repeatable), e.g. the checkpoint's "
                         "hub id that clients written for vLLM send: Org/Model-Name=PIPELINE")
    ap.add_argument("--probe-interval", type=float, default=1.0, metavar="SECONDS",
                    help="how often each Triton is health-checked (default 1.0)")
    ap.add_argument("--voices-dir", default=None, metavar="DIR",
                    help="where uploaded voices are stored (default $OMNI_VOICES_DIR or $OMNI_CACHE_DIR/voices, ~/.cache/omni-triton/voices)")
    ap.add_argument("--ws-idle-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="WS /v1/audio/speech/stream: close a session with no message while idle (default 30)")
    ap.add_argument("--ws-max-session-s", type=float, default=600.0, metavar="SECONDS",
                    help="WS /v1/audio/speech/stream: longest life of one connection (default 600)")
    ap.add_argument("--ws-max-text-chars", type=int, default=65536, metavar="N",
                    help="WS /v1/audio/speech/stream: most text in one utterance (default 65536)")
    ap.add_argument("--ws-send-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="WS /v1/audio/speech/stream: cut off a client that takes no audio this long (default 10)")
    ap.add_argument("--keep-alive", type=int, default=KEEP_ALIVE_S, metavar="SECONDS",
                    help=f"how long an idle HTTP connection is kept open (default {KEEP_ALIVE_S:g}: longer "
                         "than clients keep theirs, so a client never sends on a connection being closed)")
    ap.add_argument("--fetch-allow-host", action="append", metavar="HOST", default=[],
                    help="fetch http(s) image and audio URLs of chat messages from this host (repeatable; "
                         "*.example.com for its subdomains); default: fetch nothing, media must be data URLs")
    ap.add_argument("--fetch-allow-private", action="store_true",
                    help="allow fetching from loopback, private and link-local addresses (off: no SSRF)")
    ap.add_argument("--fetch-max-bytes", type=int, default=20 * 1024 * 1024, metavar="N",
                    help="largest image or recording fetched from a URL (default 20 MiB)")
    ap.add_argument("--fetch-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="time for a fetch, redirects included (default 10)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args(argv)
    if args.max_streams_per_pipeline < 0:
        ap.error("--max-streams-per-pipeline must be >= 0")
    if args.keep_alive <= 0:
        ap.error("--keep-alive must be > 0")
    if args.probe_interval <= 0:
        ap.error("--probe-interval must be > 0")
    if args.resolve_interval <= 0:
        ap.error("--resolve-interval must be > 0")
    if args.fetch_max_bytes < 1 or args.fetch_timeout <= 0:
        ap.error("--fetch-max-bytes must be >= 1 and --fetch-timeout > 0")
    if args.fetch_allow_private and not args.fetch_allow_host:
        ap.error("--fetch-allow-private needs --fetch-allow-host (fetching is off without allowed hosts)")
    try:
        args.model_names = parse_model_names(args.served_model_name)
    except ValueError as e:
        ap.error(str(e))
    for spec in args.triton_service or []:
        try:
            TritonService.parse(spec)
        except ValueError as e:
            ap.error(str(e))
    if min(args.ws_idle_timeout, args.ws_max_session_s, args.ws_send_timeout) <= 0 or args.ws_max_text_chars < 1:
        ap.error("--ws-idle-timeout, --ws-max-session-s and --ws-send-timeout must be > 0, "
                 "--ws-max-text-chars >= 1")
    return args


def _restart_with_glibc_tunables() -> None:
    """Run as a program, start again with the glibc settings tritonserver gets
    (`glibc_heaps.tunables`: no per-thread chunk cache, two heaps, a fixed mmap threshold): the
    chunk cache is a start-up setting only, and with it each request-handling thread kept its
    own cached chunks (+5.3 % anonymous memory over a 30-minute soak, +0.9 % without)."""
    from omni_backend.glibc_heaps import tunables

    wanted = tunables(dict(os.environ))
    if wanted != os.environ.get("GLIBC_TUNABLES", ""):
        os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": wanted})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if argv is None:   # a program of its own (not a caller's process): nothing started yet
        _restart_with_glibc_tunables()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from client.speech_api.app import create_app
    from client.speech_api.media_fetch import FetchPolicy
    from omni_backend.glibc_heaps import bound_malloc_retention

    # request handlers and encoder threads: each would keep a glibc heap at its own peak
    bound_malloc_retention()

    limits = StreamLimits(idle_timeout_s=args.ws_idle_timeout, max_session_s=args.ws_max_session_s,
                          max_text_chars=args.ws_max_text_chars, send_timeout_s=args.ws_send_timeout)
    services = args.triton_service or []
    config = ShimConfig(tritons=args.triton or ([] if services else ["localhost:8001"]),
                        triton_services=services, resolve_interval_s=args.resolve_interval,
                        api_keys=load_api_keys(args.api_key),
                        max_streams_per_pipeline=args.max_streams_per_pipeline,
                        default_pipeline=args.default_pipeline, model_names=args.model_names,
                        probe_interval_s=args.probe_interval,
                        voices_dir=args.voices_dir, stream_limits=limits,
                        fetch=FetchPolicy(tuple(args.fetch_allow_host), args.fetch_allow_private,
                                          args.fetch_max_bytes, args.fetch_timeout))
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False, timeout_graceful_shutdown=5, timeout_keep_alive=args.keep_alive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
