"""A family the shared layers have never heard of (tests/toy_family: three stages passing
tensors, declared entirely under tests/) served by a real tritonserver: its text deltas (a client
output) interleaved with its audio, a text-only request that skips the audio stages, hang-ups and
errors that free every stage; and the check that the shared layers name no model family."""
from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, stream, stream_parts, synthesize
from omni_backend.stubs import server_stubs as stubs
from omni_backend.supervisor.cpu_pressure import CpuPressure
from omni_backend.supervisor.options import SupervisorOptions
from omni_backend.testing import busy_host
from omni_backend.stubs.stub_process import STALL_REPORT_S, WorkWatch
from tests.metrics_scrape import metric
from tests.toy_family import PIPELINE, audio_of, build_repository, expected_audio, frames_of, text_pieces
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
SHARED = ("omni_backend/triton", "omni_backend/engine", "ensemble_builder", "omni_backend/families.py",
          "omni_backend/pipeline.py", "client/speech_api")


def test_shared_layers_name_no_model_family():
    """Family names and ids live in the family's folder only."""
    from omni_backend.families import pipelines

    names = {p.family for p in pipelines().values()} | set(pipelines())
    names |= {"qwen", "talker", "code2wav", "subtalker", "hibari", "orpheus", "snac", "kokoro"}
    pattern = re.compile("|".join(sorted(map(re.escape, names), key=len, reverse=True)), re.IGNORECASE)
    found = []
    for folder in SHARED:
        paths = [ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).rglob("*.py"))
        for path in paths:
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    if not (path.name == "families.py" and "omni_backend.models." in line):   # the registry lines
                        found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not found, "\n".join(found)


def _started_toy_server(repo: Path) -> TritonProcess:
    """The toy family built into `repo` and served by a supervised tritonserver."""
    server = TritonProcess(build_repository(repo), log_path=repo / "tritonserver.log")
    server.start()
    return server


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory):
    server = _started_toy_server(tmp_path_factory.mktemp("toy_repo"))
    try:
        yield server
    finally:
        server.stop()


def test_three_stages_pass_tensors(toy_server):
    text = "Tensors flow: writer -> shaper -> render. Ünïcode ok."
    res = synthesize(toy_server.grpc_url, PIPELINE, text, {"gain": 0.5})
    assert res.sample_rate == 8000
    assert len(res.chunks) == -(-len(text) // 3)         # one render call per writer piece
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio(text, 0.5))
    assert [t.reshape(-1)[0].decode() for t in res.outputs["TEXT_DELTA"]] == text_pieces(text)


def test_concurrent_requests_equal_their_solo_output(toy_server):
    texts = [f"request number {i} says {'hi ' * i}" for i in range(8)]
    outs = at_once([lambda i=i: np.concatenate(synthesize(toy_server.grpc_url, PIPELINE, texts[i],
                                                          {"gain": 1.0 + i / 4}).chunks) for i in range(8)])
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, expected_audio(texts[i], 1.0 + i / 4))


def test_a_storm_of_small_responses_never_freezes_the_entry(toy_server):
    """16 clients for 45 s, a third of them leaving after the first chunk: stage streams of many
    small responses, streams opened and cancelled all the time. When the entry read each stage
    stream as one BLS call of many responses, the Python backend's lock cycle
    (omni_backend/triton/pulled_stream.py, perf/investigations/bls_lock_cycle.py) froze the entry's whole process
    within 34-38 s of this load, every time."""
    stop = time.monotonic() + 45
    done, errors = [], []

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            text = f"client {i} request {n} " + "storm of pieces " * 20
            try:
                parts = stream_parts(toy_server.grpc_url, PIPELINE, text, {}, timeout_s=20)
                for _ in parts:
                    if n % 3 == 0:
                        break   # hang up after the first response
                parts.close()
                done.append(i)
            except TritonStreamError as e:
                errors.append(str(e))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    assert not errors, errors[:3]
    assert len(done) >= 32, len(done)
    res = synthesize(toy_server.grpc_url, PIPELINE, "after the storm", {})
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio("after the storm", 1.0))
    _assert_every_stage_freed(toy_server)


def test_bad_input_names_its_field_and_a_left_stream_frees_every_stage(toy_server):
    with pytest.raises(TritonStreamError, match=r"^invalid_request: gain:"):
        synthesize(toy_server.grpc_url, PIPELINE, "x", {"gain": 9})
    with pytest.raises(TritonStreamError, match=r"^invalid_request: voice:"):
        synthesize(toy_server.grpc_url, PIPELINE, "x", {"voice": "loud"})
    for _ in stream(toy_server.grpc_url, PIPELINE, "a long text " * 40, {}):
        break   # hang up after the first chunk
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        active = [metric(toy_server.metrics_url, "omni_stage_active_requests", model=f"{PIPELINE}__{s}")
                  for s in ("writer", "shaper")]
        if metric(toy_server.metrics_url, "omni_active_streams", pipeline=PIPELINE) == 0 and active == [0, 0]:
            break
        time.sleep(0.2)
    _assert_every_stage_freed(toy_server)
    res = synthesize(toy_server.grpc_url, PIPELINE, "still fine", {})
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio("still fine", 1.0))


def _stage_active(server, stage: str) -> float:
    return metric(server.metrics_url, "omni_stage_active_requests", model=f"{PIPELINE}__{stage}")


def _stage_requests(server, stage: str) -> float:
    return metric(server.metrics_url, "nv_inference_request_success", model=f"{PIPELINE}__{stage}")


def _assert_every_stage_freed(server) -> None:
    deadline = time.monotonic() + 20
    while True:
        active = [_stage_active(server, s) for s in ("writer", "shaper")]
        streams = metric(server.metrics_url, "omni_active_streams", pipeline=PIPELINE)
        if (streams == 0 and active == [0, 0]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert streams == 0 and active == [0, 0]


def _raw_responses(url: str, text: str, params: dict) -> list[dict[str, np.ndarray]]:
    """Every response of a stream as Triton sent it (tritonclient directly): its outputs by name."""
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("TEXT", [1], "BYTES"), grpcclient.InferInput("PARAMS", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    out = []
    try:
        client.async_stream_infer(PIPELINE, inputs, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                assert not response.outputs   # the empty final flag
                return out
            out.append({t.name: result.as_numpy(t.name) for t in response.outputs})
    finally:
        client.stop_stream()
        client.close()


def test_text_deltas_interleave_with_audio_in_arrival_order(toy_server):
    # 100 pieces, 10 ms apart: the writer is still writing when the first audio leaves
    text = ("Text deltas arrive as the writer sends them, audio as render makes it. Ünï. " * 4)[:300]
    pieces = text_pieces(text)
    responses = _raw_responses(toy_server.grpc_url, text, {"gain": 2.0})
    for r in responses:   # each response carries what arrived: a text delta, or audio with its rate
        assert set(r) in ({"TEXT_DELTA"}, {"AUDIO", "SAMPLE_RATE"}), set(r)
        assert all(v.size for v in r.values())   # never an empty response
    at_text = [i for i, r in enumerate(responses) if "TEXT_DELTA" in r]
    at_audio = [i for i, r in enumerate(responses) if "AUDIO" in r]
    texts = [responses[i]["TEXT_DELTA"].reshape(-1)[0].decode() for i in at_text]
    assert texts == pieces                                    # in the order the writer sent them
    assert len(at_audio) == len(pieces)
    for i, piece in enumerate(pieces):                        # each chunk is its piece's audio, in order
        tokens = np.array([ord(c) for c in piece], dtype=np.int64)
        np.testing.assert_array_equal(responses[at_audio[i]]["AUDIO"], audio_of(frames_of(tokens), 2.0))
        assert at_text[i] < at_audio[i]                       # a piece's text leaves before its audio
    assert all(int(responses[i]["SAMPLE_RATE"][0]) == 8000 for i in at_audio)
    assert at_audio[0] < at_text[-1], "text and audio did not interleave"
    # the speech clients read the audio and skip the text (synthesize keeps it aside)
    res = synthesize(toy_server.grpc_url, PIPELINE, text, {"gain": 2.0})
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio(text, 2.0))
    assert [c.size for c, _ in stream(toy_server.grpc_url, PIPELINE, text, {"gain": 2.0})] == \
        [responses[i]["AUDIO"].size for i in at_audio]


def test_return_audio_false_streams_text_only_and_skips_the_audio_stages(toy_server):
    text = "only the writer runs here " * 8
    pieces = text_pieces(text)
    # Triton counts every request a stage answers: with audio, one shaper stream per piece; the
    # supervisor's pings (one a second) are the only other ones.
    before = _stage_requests(toy_server, "shaper")
    synthesize(toy_server.grpc_url, PIPELINE, text, {})
    with_audio = _stage_requests(toy_server, "shaper") - before
    assert with_audio >= len(pieces)
    before = _stage_requests(toy_server, "shaper")
    parts = list(stream_parts(toy_server.grpc_url, PIPELINE, text, {"return_audio": False}))
    text_only = _stage_requests(toy_server, "shaper") - before
    assert text_only < len(pieces) // 4, (text_only, with_audio)
    assert all(p.audio is None and set(p.outputs) == {"TEXT_DELTA"} for p in parts)
    assert [p.outputs["TEXT_DELTA"].reshape(-1)[0].decode() for p in parts] == pieces
    res = synthesize(toy_server.grpc_url, PIPELINE, text, {"return_audio": False})
    assert res.chunks == [] and len(res.outputs["TEXT_DELTA"]) == len(text_pieces(text))
    _assert_every_stage_freed(toy_server)


@pytest.mark.parametrize("params", [{}, {"return_audio": False}])
def test_a_client_that_leaves_after_text_frees_every_stage(toy_server, params):
    for part in stream_parts(toy_server.grpc_url, PIPELINE, "a long text " * 40, params):
        assert "TEXT_DELTA" in part.outputs   # the first response is the first piece's text
        break   # hang up
    _assert_every_stage_freed(toy_server)


@pytest.mark.parametrize("params", [{}, {"return_audio": False}])
def test_a_failing_text_stage_ends_the_request_with_its_code_and_frees_every_stage(toy_server, params):
    text = "the writer fails after two pieces of this text"
    texts = []
    with pytest.raises(TritonStreamError, match=r"^invalid_request: fail_after: the writer failed as asked"):
        for part in stream_parts(toy_server.grpc_url, PIPELINE, text, {**params, "fail_after": 2}):
            texts += [t.reshape(-1)[0].decode() for t in part.outputs.values()]
    assert texts == text_pieces(text)[:2]
    _assert_every_stage_freed(toy_server)
    res = synthesize(toy_server.grpc_url, PIPELINE, "still fine", params)
    assert [t.reshape(-1)[0].decode() for t in res.outputs["TEXT_DELTA"]] == text_pieces("still fine")


def _stubs_of(server: TritonProcess, model: str) -> list[stubs.Stub]:
    found = [s for s in stubs.stubs_of(server.server_pid) if s.model == model]
    assert len(found) == 1
    return found


def _serves_again_without(server: TritonProcess, stuck: stubs.Stub) -> None:
    """The stuck stub is gone, the pipeline reloaded and ready, and it answers exactly."""
    deadline = time.monotonic() + 120
    while not (not stubs.alive(stuck) and "reloaded" in server.log_text() and _ready(server)):
        assert time.monotonic() < deadline, server.log_text()[-3000:]
        time.sleep(0.2)
    res = synthesize(server.grpc_url, PIPELINE, "the writer is back", {})
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio("the writer is back", 1.0))


def _ended_unavailable(server: TritonProcess, stage: str, hooks: dict, audio_only: bool = False) -> float:
    """Stream a long text with a test hook: it must end with `unavailable:` naming `stage`. The
    seconds from its last part (with `audio_only`, its last audio) to that end."""
    last = time.monotonic()
    with pytest.raises(TritonStreamError, match=rf"^unavailable: .*{PIPELINE}__{stage}"):
        for part in stream_parts(server.grpc_url, PIPELINE, "a long text " * 40, hooks, timeout_s=60):
            if not audio_only or (part.audio is not None and part.audio.size):
                last = time.monotonic()
    return time.monotonic() - last


def test_a_stage_whose_responses_stop_leaving_is_noticed_and_reloaded(tmp_path):
    """The writer's response thread blocks for good (tests/toy_family: `stall_responses_after`)
    while its event loop keeps running, so nothing it answers leaves. Its heartbeat stops once
    responses have waited STALL_REPORT_S (omni_backend/stubs/stub_process.py), the supervisor
    reloads the pipeline when that beat is `stalled_secs` old beside fresh ones, the stream ends
    with `unavailable:` naming the writer, the stuck stub is gone and the pipeline serves again,
    exactly. (Pings alone do not heal it that soon: under overload a healthy stage can answer
    nothing for seconds, supervisor.py `_wedged`.)"""
    server = _started_toy_server(tmp_path / "toy_repo")
    try:
        writer = _stubs_of(server, f"{PIPELINE}__writer")
        t0 = time.monotonic()
        _ended_unavailable(server, "writer", {"stall_responses_after": 2})
        assert time.monotonic() - t0 < STALL_REPORT_S + SupervisorOptions().stalled_secs + 10.0
        _serves_again_without(server, writer[0])
    finally:
        server.stop()


# the fast verdicts need a host with CPU to spare (on a starved one the supervisor waits
# `stalled_secs`, as it should): alone, after the parallel pass, where the other worker's servers
# starved this one's (74 % of the time) and the stream ended after 10.2 s
@pytest.mark.serial
@pytest.mark.parametrize("hook, verdict, held_by", [
    ("block_loop_after", "its event loop's thread neither ran nor waited for a CPU",
     r'toy_family/stages\.py", line \d+ in generate'),
    ("hog_gil_after", "its event loop's thread neither ran nor waited for a CPU",
     r'toy_family/stages\.py", line \d+ in _hog_gil'),
    ("spin_loop_after", "without coming back to its loop", r'toy_family/stages\.py", line \d+ in generate'),
])
def test_a_stage_whose_event_loop_blocks_is_noticed_and_its_streams_end_within_5_s(tmp_path, hook, verdict, held_by):
    """The writer's event loop blocks for good (tests/toy_family: `block_loop_after`, as in a
    deadlock), or waits for good for the GIL that another of its threads holds while it runs
    (`hog_gil_after`: the stub uses a CPU, its loop does not): its heartbeat stops, its loop's
    thread neither runs nor waits for a CPU; or one step of the loop runs without end
    (`spin_loop_after`: the loop's thread runs, the loop never ticks). The host has CPU to spare,
    so the supervisor does not wait `stalled_secs` (supervisor.py `_blocked`): the stream ends
    with `unavailable:` naming the writer within 5 s of its last part, the writer's stacks are in
    the log (what held it named), and the pipeline serves again, exactly."""
    server = _started_toy_server(tmp_path / "toy_repo")
    try:
        writer = _stubs_of(server, f"{PIPELINE}__writer")
        ended_after = _ended_unavailable(server, "writer", {hook: 2})
        log = server.log_text()
        assert ended_after < 5.0, log[-3000:]
        assert verdict in log, log[-3000:]
        assert re.search(held_by, log), log[-3000:]
        _serves_again_without(server, writer[0])
    finally:
        server.stop()


@pytest.mark.serial   # needs CPU to spare, as above
@pytest.mark.parametrize("hook, verdict, bound_s", [
    ("block_render_after", "its batch worker's thread neither ran nor waited for a CPU", 5.0),
    ("spin_render_after", "a computation that does not end", WorkWatch.OVERRUN_FLOOR_S + 5.0),
])
def test_a_batched_stage_whose_worker_blocks_or_computes_without_end_is_noticed(tmp_path, hook, verdict, bound_s):
    """Render's batch worker blocks for good in its batch (tests/toy_family: `block_render_after`,
    as in a deadlock in a codec): its heartbeat, beaten from a thread of its own, stops because the
    worker sleeps mid-batch (stub_process.WorkWatch), and the supervisor reads the worker's thread
    as it reads a loop's: the stream ends with `unavailable:` naming render within 5 s of the
    blocked call's last audio. Or the batch computes without end (`spin_render_after`): once it
    has used more CPU than its budget (WorkWatch.OVERRUN_FLOOR_S for the toy's quick batches) the
    beat stops with why, and the supervisor acts at once. Either way the worker's stacks are in
    the log and the pipeline serves again, exactly. (Before, only the failing pings told, after
    `unresponsive_secs`: 120 s.)"""
    server = _started_toy_server(tmp_path / "toy_repo")
    try:
        render = _stubs_of(server, f"{PIPELINE}__render")
        ended_after = _ended_unavailable(server, "render", {hook: 3}, audio_only=True)
        log = server.log_text()
        assert ended_after < bound_s, log[-3000:]
        assert verdict in log, log[-3000:]
        assert re.search(r'toy_family/stages\.py", line \d+ in run_batch', log), log[-3000:]
        _serves_again_without(server, render[0])
    finally:
        server.stop()


@pytest.mark.serial   # loads every core on purpose: alone, after the parallel pass
@pytest.mark.skipif(not stubs.reads_thread_waits(), reason="no /proc/<pid>/task/<tid>/syscall here")
def test_a_stage_whose_event_loop_blocks_on_a_starved_host_is_noticed_within_5_s(tmp_path):
    """As above, with the host starved of CPU (8 busy processes per core) while the writer's loop
    blocks: there a healthy loop can sleep on tritonserver, so the supervisor also reads what the
    loop's thread waits in; an event of its own, waited for with no timeout, is nothing a starved
    host explains (supervisor.py `_blocked`). The stream still ends within 5 s of its last part."""
    server = _started_toy_server(tmp_path / "toy_repo")
    try:
        writer = _stubs_of(server, f"{PIPELINE}__writer")
        log_start = len(server.log_text())
        with busy_host.starved(per_core=8):
            time.sleep(1.0)                               # the host's pressure is up before the loop blocks
            ended_after = _ended_unavailable(server, "writer", {"block_loop_after": 2})
        log = server.log_text()[log_start:]
        assert ended_after < 5.0, log[-3000:]
        assert "waiting in a lock or event of its own process, with no timeout" in log, log[-3000:]
        if CpuPressure().has_psi:
            assert "the host is starved, but nothing outside the stub holds it" in log, log[-3000:]
        _serves_again_without(server, writer[0])
    finally:
        server.stop()


def _ready(server: TritonProcess) -> bool:
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_stage_that_dies_under_more_streams_than_tritons_threads_ends_them_without_a_restart(tmp_path):
    """40 streams, each with a pull in flight to the shaper, when its stub is killed: those pulls
    never return, and each holds one of the Python backend's threads of the entry's instance,
    which also send the entry's responses. With Triton's 32 the entry could send nothing (its
    streams' errors, its answer to the supervisor's `abort`) and the supervisor restarted the
    whole server; with more threads than an entry's BLS calls (omni_backend/deploy.py) every
    stream ends with `unavailable:` at once and only the pipeline is reloaded. (A stub killed
    while it holds the backend's shared-memory lock aborts tritonserver 2.51 itself, with
    `lock_exception`: that shows nothing of the threads, so the kill is then made once more.)"""
    server = _started_toy_server(tmp_path / "toy_repo")
    n = 40

    def kill_the_shaper_under_load() -> list[tuple[float, str]]:
        running = threading.Semaphore(0)
        ended: list[tuple[float, str]] = []

        def client(i: int) -> None:
            try:
                first = True
                for _ in stream_parts(server.grpc_url, PIPELINE, f"stream {i} " + "a long text " * 300, {},
                                      timeout_s=90):
                    if first:
                        running.release()
                        first = False
                ended.append((time.monotonic(), "ok"))
            except TritonStreamError as e:
                ended.append((time.monotonic(), str(e)))

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for _ in range(n):
            assert running.acquire(timeout=60), "not every stream began"
        stubs.kill([s for s in stubs.stubs_of(server.server_pid) if s.model == f"{PIPELINE}__shaper"])
        killed_at = time.monotonic()
        for t in threads:
            t.join(90)
        return [(at - killed_at, why) for at, why in ended]

    try:
        for attempt in range(2):
            first_pid, log_start = server.server_pid, len(server.log_text())
            ended = kill_the_shaper_under_load()
            log = server.log_text()[log_start:]
            if "lock_exception" in log and attempt == 0:
                deadline = time.monotonic() + 120
                while not (_ready(server) and server.server_pid not in (None, first_pid)):
                    assert time.monotonic() < deadline, server.log_text()[-3000:]
                    time.sleep(0.2)
                continue
            late = [(round(after, 1), why[:120]) for after, why in ended
                    if not why.startswith("unavailable:") or after > 5.0]
            assert len(ended) == n and not late, late
            deadline = time.monotonic() + 120
            while not ("reloaded" in server.log_text()[log_start:] and _ready(server)):
                assert time.monotonic() < deadline, server.log_text()[-3000:]
                time.sleep(0.2)
            log = server.log_text()[log_start:]
            assert server.server_pid == first_pid and "restarting tritonserver" not in log, log[-3000:]
            break
        res = synthesize(server.grpc_url, PIPELINE, "the shaper is back", {})
        np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio("the shaper is back", 1.0))
    finally:
        server.stop()
