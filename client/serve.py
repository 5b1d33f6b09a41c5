"""`make serve`: build the model repository, start tritonserver and the OpenAI speech API.

Prints the URLs and a curl line; Ctrl-C (or SIGTERM) stops both.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from client.triton_process import TritonProcess

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m client.serve", description=__doc__)
    ap.add_argument("--model-repository", default=str(ROOT / "model_repository"))
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--shim-port", type=int, default=8080)
    ap.add_argument("--host", default="0.0.0.0", help="address the speech API listens on")
    ap.add_argument("--no-build", action="store_true", help="serve the repository as it is")
    args = ap.parse_args(argv)

    if not args.no_build:
        print("[serve] building the model repository", flush=True)
        subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--all",
                        "--out", args.model_repository], check=True)
    log = Path(args.model_repository).resolve().parent / "tritonserver.log"
    server = TritonProcess(args.model_repository, args.http_port, args.grpc_port, args.metrics_port,
                           log_path=log)
    shim = None
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        t0 = time.monotonic()
        print(f"[serve] starting tritonserver (log: {log})", flush=True)
        server.start()
        print(f"[serve] tritonserver ready in {time.monotonic() - t0:.1f} s", flush=True)
        shim = subprocess.Popen([sys.executable, "-m", "client.speech_api", "--triton", server.grpc_url,
                                 "--host", args.host, "--port", str(args.shim_port)])
        print(f"""
  Triton HTTP     http://localhost:{args.http_port}/v2/health/ready
  Triton gRPC     localhost:{args.grpc_port}
  Metrics         http://localhost:{args.metrics_port}/metrics
  OpenAI API      http://localhost:{args.shim_port}/v1/audio/speech   (web page: http://localhost:{args.shim_port}/)

  curl -s http://localhost:{args.shim_port}/v1/audio/speech -H 'Content-Type: application/json' \\
    -d '{{"model": "hibari", "input": "Hello! This server speaks.", "voice": "heart", "response_format": "wav"}}' \\
    -o hello.wav
  python -m client.stream "Hello! This server speaks." -o hello.wav --url localhost:{args.grpc_port}

Ctrl-C stops both.""", flush=True)
        while not stopping:
            if server.proc is None or server.proc.poll() is not None:
                print("[serve] tritonserver exited", file=sys.stderr)
                return 1
            if shim.poll() is not None:
                print("[serve] the speech API exited", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        # Both at once: the supervisor drains Triton's streams (they end, or end with
        # `unavailable:`), so the speech API's open responses finish inside the same 10 s.
        print("\n[serve] stopping", flush=True)
        deadline = time.monotonic() + 10
        if shim is not None and shim.poll() is None:
            shim.terminate()
        server.stop(timeout_s=10)
        if shim is not None:
            try:
                shim.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                shim.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
