#!/usr/bin/env bash
# Drive a pipeline's entry model with perf_analyzer (gRPC streaming) at concurrency 1, 4 and 8.
# Usage: perf/perf_analyzer.sh PIPELINE [--url localhost:8001] [--concurrency 1:8:...] [extra args]
# Time to first audio is read from perf_analyzer's profile export (each response's timestamp):
# the latency perf_analyzer prints for a decoupled model runs to the stream's LAST response.
# Without --url it starts its own tritonserver on free ports with model_repository/.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPELINE=${1:?usage: perf/perf_analyzer.sh PIPELINE [--url HOST:PORT] [--concurrency LIST] [extra perf_analyzer args]}
shift
URL=""
CONCURRENCY="1 4 8"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --url) URL=$2; shift 2 ;;
    --concurrency) CONCURRENCY=${2//,/ }; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PA=$(dirname "$PY")/perf_analyzer  # the ELF binary the tritonclient 2.51.0 wheel installs
# perf_analyzer links libcudart even on CPU: the PyPI runtime provides it (no GPU needed).
export LD_LIBRARY_PATH=$SITE/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DATA=perf/data/$PIPELINE.json
[ -f "$DATA" ] || { echo "no input data: $DATA" >&2; exit 2; }
SERVER_PID=""
OUT=""
# the profile exports hold every response's outputs (audio: about 1.3 GB a level for hibari at c = 4)
cleanup() {
  [ -n "$OUT" ] && rm -rf "$OUT"
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
}
trap cleanup EXIT
if [ -z "$URL" ]; then
  PORTS=$($PY -c 'from client.triton_process import free_port as f; print(f(), f(), f())')
  read -r HTTP GRPC METRICS <<<"$PORTS"
  $PY -c "
import signal, sys, time
from client.triton_process import TritonProcess
s = TritonProcess('model_repository', $HTTP, $GRPC, $METRICS, log_path='/tmp/perf_analyzer_tritonserver.log').start()
print('tritonserver ready', flush=True)
signal.signal(signal.SIGTERM, lambda *a: (s.stop(), sys.exit(0)))
while True: time.sleep(1)
" &
  SERVER_PID=$!
  # every pipeline of the repository loads first: minutes on a busy 2-core host
  READY=""
  for _ in $(seq 600); do
    curl -sf "localhost:$HTTP/v2/health/ready" >/dev/null 2>&1 && { READY=1; break; }
    kill -0 $SERVER_PID 2>/dev/null || { echo "tritonserver failed to start" >&2; exit 1; }
    sleep 0.5
  done
  [ -n "$READY" ] || { echo "tritonserver not ready after 300 s (log: /tmp/perf_analyzer_tritonserver.log)" >&2; exit 1; }
  URL=localhost:$GRPC
fi
OUT=$(mktemp -d)
for C in $CONCURRENCY; do
  echo "== $PIPELINE, concurrency $C" >&2
  "$PA" -m "$PIPELINE" -u "$URL" -i grpc --streaming --input-data "$DATA" \
    --concurrency-range "$C:$C" --measurement-interval 4000 --stability-percentage 50 \
    --max-trials 4 -f "$OUT/c$C.csv" --profile-export-file "$OUT/c$C.json" "${EXTRA[@]}" > "$OUT/c$C.log" 2>&1 || { cat "$OUT/c$C.log" >&2; exit 1; }
  grep -E "Client:|Request count|Throughput|p50 latency|p95 latency|Avg latency|error" "$OUT/c$C.log" >&2 || true
done
echo
printf '%-12s %12s %14s %14s %14s %16s\n' concurrency "req/s" "p50 ttfa ms" "p95 ttfa ms" "avg ttfa ms" "p50 stream ms"
for C in $CONCURRENCY; do
  $PY - "$OUT/c$C.csv" "$OUT/c$C.json" <<'PYEOF'
import csv, mmap, re, statistics, sys
sys.path.insert(0, "perf")
from benchkit.percentiles import percentile
rate = float(list(csv.DictReader(open(sys.argv[1])))[-1]["Inferences/Second"])
# The export is read by pattern, not as a whole: it holds every response's outputs (GBs of audio as
# JSON numbers), and only the timestamps are needed. One experiment (one concurrency) per file.
with open(sys.argv[2], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as export:
    level = re.search(rb'"experiment":\{"mode":"[a-z_]+","value":(\d+)', export)
    requests = [(int(m[1]), [int(t) for t in m[2].split(b",") if t]) for m in re.finditer(
        rb'\{"timestamp":(\d+),"request_inputs":.*?,"response_timestamps":\[([0-9,]*)\]', export, re.S)]
    tail = re.search(rb'"window_boundaries":\[([0-9,]*)\]\}\],"version"', export[-65536:])
    if level is None or tail is None:
        sys.exit(f"{sys.argv[2]}: the profile export is incomplete (a full disk?)")
    level, bounds = int(level[1]), [int(t) for t in tail[1].split(b",") if t]
# the windows perf_analyzer's own figures come from: its last three (stable) ones
start, end = (bounds[-4] if len(bounds) >= 4 else bounds[0], bounds[-1]) if len(bounds) >= 2 else (0, float("inf"))
sent = [r for r in requests if start <= r[0] < end] or requests
silent = [r for r in sent if not r[1]]
if silent or not sent:
    sys.exit(f"{len(silent)} of {len(sent)} requests got no response")
ttfa = [(times[0] - t0) / 1e6 for t0, times in sent]
whole = [(times[-1] - t0) / 1e6 for t0, times in sent]
print(f"{level:<12} {rate:12.2f} {statistics.median(ttfa):14.1f} {percentile(ttfa, 95):14.1f} "
      f"{statistics.fmean(ttfa):14.1f} {statistics.median(whole):16.1f}")
PYEOF
done
